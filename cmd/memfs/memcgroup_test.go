package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/replace"
)

// memCgroup is a memory cgroup made for one test: cgroup v2 where its
// memory controller is enabled, else the v1 memory controller.
type memCgroup struct {
	dir string
	v1  bool
}

func newMemCgroup(t *testing.T, limit uint64) *memCgroup {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a memory cgroup needs root")
	}
	name := fmt.Sprintf("memfs-test-%d", os.Getpid())
	var c *memCgroup
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && strings.Contains(string(b), "memory") {
		c = &memCgroup{dir: filepath.Join("/sys/fs/cgroup", name)}
	} else if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		c = &memCgroup{dir: filepath.Join("/sys/fs/cgroup/memory", name), v1: true}
	} else {
		t.Skip("no writable memory cgroup controller")
	}
	require.NoError(t, os.Mkdir(c.dir, 0o755))
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return os.Remove(c.dir) == nil }, 10*time.Second, 50*time.Millisecond)
	})
	lim := strconv.FormatUint(limit, 10)
	if c.v1 {
		require.NoError(t, os.WriteFile(filepath.Join(c.dir, "memory.limit_in_bytes"), []byte(lim), 0o644))
		// Memory plus swap: no way out through swap where the host has any.
		_ = os.WriteFile(filepath.Join(c.dir, "memory.memsw.limit_in_bytes"), []byte(lim), 0o644)
	} else {
		require.NoError(t, os.WriteFile(filepath.Join(c.dir, "memory.max"), []byte(lim), 0o644))
		_ = os.WriteFile(filepath.Join(c.dir, "memory.swap.max"), []byte("0"), 0o644)
	}
	return c
}

// command runs bin with args inside the cgroup from its first instruction.
func (c *memCgroup) command(bin string, args ...string) *exec.Cmd {
	procs := filepath.Join(c.dir, "cgroup.procs")
	return exec.Command("sh", append([]string{"-c", `echo $$ > "` + procs + `" && exec "$0" "$@"`, bin}, args...)...)
}

// stat reads one "key value" line of a cgroup file.
func (c *memCgroup) stat(t *testing.T, file, key string) uint64 {
	t.Helper()
	f, err := os.Open(filepath.Join(c.dir, file))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == key {
			n, err := strconv.ParseUint(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

func (c *memCgroup) oomKills(t *testing.T) uint64 {
	if c.v1 {
		return c.stat(t, "memory.oom_control", "oom_kill")
	}
	return c.stat(t, "memory.events", "oom_kill")
}

func (c *memCgroup) peak(t *testing.T) uint64 {
	f := "memory.peak"
	if c.v1 {
		f = "memory.max_usage_in_bytes"
	}
	b, err := os.ReadFile(filepath.Join(c.dir, f))
	require.NoError(t, err)
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// TestNodeInMemoryCgroupRefusesWritesBeforeTheOOMKiller runs a one-node
// cluster in a memory cgroup of 640 MiB with --memory-limit 600MiB and
// writes 1 MiB files of distinct random data from 8 clients until every
// one of them gets ENOSPC. The node must never be OOM-killed, must hold a
// fair share of its limit in file data, and must read back every write it
// acknowledged. It also checks that the node refuses a limit larger than
// the cgroup's.
func TestNodeInMemoryCgroupRefusesWritesBeforeTheOOMKiller(t *testing.T) {
	if testing.Short() {
		t.Skip("writes half a GiB")
	}
	const cgLimit, nodeLimit = 640 << 20, 600 << 20
	cg := newMemCgroup(t, cgLimit)
	bin := memfsBinary(t)
	ports := freePorts(t, 2)
	data := filepath.Join(t.TempDir(), "a")

	out, err := cg.command(bin, "server", "--id", "a", "--data", data, "--bootstrap", "--insecure",
		"--raft-addr", ports[0], "--api-addr", ports[1], "--memory-limit", "1GiB").CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 2, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "more than this host can back")

	logs := &syncBuffer{}
	cmd := cg.command(bin, "server", "--id", "a", "--data", data, "--bootstrap", "--insecure",
		"--raft-addr", ports[0], "--api-addr", ports[1], "--memory-limit", "600MiB")
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	require.Eventually(t, func() bool {
		st, err := replace.LocalStatus(context.Background(), replace.Net{}, ports[1])
		return err == nil && st.State == "Leader"
	}, 30*time.Second, 50*time.Millisecond, "node never led: %s", logs)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.New(ctx, []string{ports[1]})
	require.NoError(t, err)
	defer c.Close()

	const size = 1 << 20
	var (
		mu    sync.Mutex
		acked []int
		other []error
		wg    sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			full := 0
			for i := w; full < 3 && ctx.Err() == nil; i += 8 {
				err := c.WriteFile(fmt.Sprintf("/f%05d", i), randomData(size, byte(i), byte(i>>8)), 0o644)
				mu.Lock()
				switch {
				case err == nil:
					acked = append(acked, i)
					full = 0
				case errors.Is(err, syscall.ENOSPC):
					full++
				default:
					other = append(other, err)
					full = 3
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	select {
	case err := <-done:
		t.Fatalf("the node exited (%v) during the writes; OOM kills %d; log:\n%s", err, cg.oomKills(t), logs)
	default:
	}
	require.Empty(t, other, "only ENOSPC may refuse a write")
	require.Zero(t, cg.oomKills(t))
	stored := uint64(len(acked)) * size
	st, err := replace.LocalStatus(ctx, replace.Net{}, ports[1])
	require.NoError(t, err)
	t.Logf("acknowledged %d MiB under a %d MiB limit; cgroup peak %d MiB (page cache included); node RSS %d MiB, anonymous %d, blocks %d, block budget %d",
		stored>>20, nodeLimit>>20, cg.peak(t)>>20, st.RssBytes>>20, st.AnonBytes>>20, st.BlockMemoryBytes>>20, st.BlockBudget>>20)
	require.Greater(t, stored, uint64(nodeLimit/2), "the limit should leave most of itself to data")
	for _, i := range acked {
		got, err := c.ReadFile(fmt.Sprintf("/f%05d", i))
		require.NoError(t, err)
		require.Equal(t, randomData(size, byte(i), byte(i>>8)), got, "file %d", i)
	}
	require.Zero(t, cg.oomKills(t))
}
