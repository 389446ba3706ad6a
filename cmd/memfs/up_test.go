package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
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

	"github.com/memoryfs/memfs/server/servertest"
	"github.com/memoryfs/memfs/test/procs"
)

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
)

// memfsBinary builds this command once per test run, as the process tests
// build it (procs.Build).
func memfsBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "memfs-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtPath, buildErr = procs.Build(dir)
	})
	require.NoError(t, buildErr)
	return builtPath
}

// freeBasePort finds a base port whose API, Raft and metrics ports for n
// nodes (memfs up's layout) are all free right now, between 20000 and
// 50000, or within MEMFS_TEST_BASE_PORTS=LO-HI (the bases, so that runs
// sharing a machine can keep apart).
func freeBasePort(t *testing.T, n int) int {
	t.Helper()
	lo, hi := 20000, 50000
	if r := os.Getenv("MEMFS_TEST_BASE_PORTS"); r != "" {
		a, b, ok := strings.Cut(r, "-")
		var err1, err2 error
		lo, err1 = strconv.Atoi(a)
		hi, err2 = strconv.Atoi(b)
		require.True(t, ok && err1 == nil && err2 == nil && lo < hi, "MEMFS_TEST_BASE_PORTS=%q: want LO-HI", r)
	}
	for range 100 {
		if base := lo + rand.IntN(hi-lo); basePortFree(base, n) {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// basePortFree reports whether memfs up's ports for n nodes from base are
// free right now.
func basePortFree(base, n int) bool {
	for i := 1; i <= n; i++ {
		for _, p := range []int{base + i, base + 100 + i, base + 200 + i} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				return false
			}
			l.Close()
		}
	}
	return true
}

// syncBuffer is a bytes.Buffer safe for a child process and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// upProcess is a running `memfs up`.
type upProcess struct {
	cmd     *exec.Cmd
	out     *syncBuffer
	done    chan struct{}
	err     error
	cluster string
	sec     []string // --ca, --cert and --key of the admin certificate; none with --insecure
}

// upTLSFlags are the client flags of the admin certificate `memfs up`
// makes in dir.
func upTLSFlags(dir string) []string {
	tls := filepath.Join(dir, "tls")
	return []string{"--ca", filepath.Join(tls, "ca.crt"), "--cert", filepath.Join(tls, "admin.crt"), "--key", filepath.Join(tls, "admin.key")}
}

// startUp runs "memfs up" with 3 nodes, over TLS as by default when
// secure, else with --insecure; serverArgs go after "--".
func startUp(t *testing.T, bin, dir string, base int, secure bool, serverArgs ...string) *upProcess {
	t.Helper()
	return startUpWith(t, bin, dir, base, secure, nil, serverArgs...)
}

// startUpWith is startUp with more flags of up's own (upArgs).
func startUpWith(t *testing.T, bin, dir string, base int, secure bool, upArgs []string, serverArgs ...string) *upProcess {
	t.Helper()
	p := &upProcess{out: &syncBuffer{}, done: make(chan struct{})}
	args := append([]string{"up", "--nodes", "3", "--dir", dir, "--base-port", fmt.Sprint(base)}, upArgs...)
	if secure {
		p.sec = upTLSFlags(dir)
	} else {
		args = append(args, "--insecure")
	}
	if len(serverArgs) > 0 {
		args = append(append(args, "--"), serverArgs...)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			<-p.done
		}
	})
	p.cluster = fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", base+1, base+2, base+3)
	return p
}

// upReady starts `memfs up --insecure` on free ports and waits until its
// status answers; base is its --base-port.
func upReady(t *testing.T) (bin string, p *upProcess, base int) {
	t.Helper()
	bin = memfsBinary(t)
	base = freeBasePort(t, 3)
	p = startUp(t, bin, t.TempDir(), base, false)
	waitStatus(t, bin, p)
	return bin, p, base
}

// upCLI starts a 3-node cluster of real node processes with memfs up and
// returns the CLI against it. Tests that load the cluster use it rather
// than an in-process cluster, which the race detector would slow down
// beside the load until sessions expire.
func upCLI(t *testing.T) cli {
	t.Helper()
	bin, p, _ := upReady(t)
	return cli{t: t, bin: bin, cluster: p.cluster}
}

// stop sends SIGINT, as Ctrl-C does, and waits for a clean exit.
func (p *upProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(os.Interrupt))
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("memfs up did not stop; output:\n%s", p.out.String())
	}
	require.NoError(t, p.err, p.out.String())
}

// statusJSONOf is the part of `memfs status --json` scripts rely on.
type statusJSONOf struct {
	Leader string `json:"leader"`
	Nodes  []struct {
		ID           string  `json:"id"`
		APIAddr      string  `json:"api_addr"`
		RaftAddr     string  `json:"raft_addr"`
		State        string  `json:"state"`
		AppliedIndex *uint64 `json:"applied_index"`
		RSSBytes     uint64  `json:"rss_bytes"`
		MemoryLimit  uint64  `json:"process_memory_limit"`
		BlockBudget  uint64  `json:"block_budget"`
	} `json:"nodes"`
	Inodes        *uint64 `json:"inodes"`
	LogicalBytes  *uint64 `json:"logical_bytes"`
	PhysicalBytes *uint64 `json:"physical_bytes"`
}

// waitStatus polls `memfs status --json` until it names a leader and
// every node answers.
func waitStatus(t *testing.T, bin string, p *upProcess) statusJSONOf {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("memfs up exited: %v\n%s", p.err, p.out.String())
		default:
		}
		out, err := exec.Command(bin, append([]string{"status", "--json", "--cluster", p.cluster, "--timeout", "3s"}, p.sec...)...).Output()
		if err == nil {
			var st statusJSONOf
			require.NoError(t, json.Unmarshal(out, &st), "%s", out)
			if st.Leader != "" && len(st.Nodes) == 3 && allAnswered(st) &&
				strings.Contains(p.out.String(), "Press Ctrl-C") {
				return st
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready cluster: %v %s\nup output:\n%s", err, out, p.out.String())
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
}

func allAnswered(st statusJSONOf) bool {
	for _, n := range st.Nodes {
		if n.State == "" {
			return false
		}
	}
	return true
}

func TestUpStatusEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	dir := t.TempDir()
	base := freeBasePort(t, 3)

	p := startUp(t, bin, dir, base, true)
	st := waitStatus(t, bin, p)
	leaders := 0
	for i, n := range st.Nodes {
		require.Equal(t, fmt.Sprintf("n%d", i+1), n.ID)
		require.Equal(t, fmt.Sprintf("127.0.0.1:%d", base+i+1), n.APIAddr)
		require.Equal(t, fmt.Sprintf("127.0.0.1:%d", base+100+i+1), n.RaftAddr)
		require.Contains(t, []string{"Leader", "Follower"}, n.State)
		require.NotNil(t, n.AppliedIndex)
		// Each node reports its own process's memory and the block budget
		// its whole-process limit leaves.
		require.NotZero(t, n.RSSBytes)
		require.NotZero(t, n.MemoryLimit)
		require.Less(t, n.BlockBudget, n.MemoryLimit)
		if n.State == "Leader" {
			leaders++
			require.Equal(t, st.Leader, n.ID)
		}
	}
	require.Equal(t, 1, leaders)
	require.NotNil(t, st.Inodes)
	require.NotNil(t, st.LogicalBytes)
	require.NotNil(t, st.PhysicalBytes)
	require.EqualValues(t, 1, *st.Inodes, "a new cluster holds the root only")
	require.Contains(t, p.out.String(), "export MEMFS_CLUSTER="+p.cluster)
	require.Contains(t, p.out.String(), "export MEMFS_CA="+p.sec[1]+" MEMFS_CERT="+p.sec[3]+" MEMFS_KEY="+p.sec[5])

	// Without the CA a command cannot reach the TLS cluster, and says so.
	out, err := exec.Command(bin, "--cluster", p.cluster, "--timeout", "3s", "ls", "/").CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "memfs: ")

	require.Contains(t, p.out.String(), fmt.Sprintf("export MEMFS_METRICS=127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
		base+201, base+202, base+203), "what memfs top reads")
	// up waited for every node's /readyz, which memfs health asks too.
	for i := 1; i <= 3; i++ {
		m := fmt.Sprintf("127.0.0.1:%d", base+200+i)
		require.Contains(t, p.out.String(), "status page http://"+m+"/")
		require.Equal(t, m+"/readyz: ok\n", runOK(t, bin, "health", m))
		require.Equal(t, m+"/livez: ok\n", runOK(t, bin, "health", "--live", m))
	}

	// A file put through the cluster reads back, and counts in the status.
	local := filepath.Join(t.TempDir(), "hello.txt")
	require.NoError(t, os.WriteFile(local, []byte("hello, memfs\n"), 0o644))
	runOK(t, bin, append(p.sec, "--cluster", p.cluster, "put", local, "/hello.txt")...)
	require.Equal(t, "hello, memfs\n", runOK(t, bin, append(p.sec, "--cluster", p.cluster, "cat", "/hello.txt")...))
	// A token made by the admin works in place of a certificate, with its
	// role, until it is revoked.
	tokFile := filepath.Join(t.TempDir(), "reader.token")
	out = []byte(runOK(t, bin, append(p.sec, "--cluster", p.cluster, "token", "create", "--role", "read", "--name", "test", "--out", tokFile)...))
	require.Contains(t, string(out), "written to "+tokFile)
	id := strings.Fields(string(out))[1]
	withToken := []string{"--ca", p.sec[1], "--token-file", tokFile, "--cluster", p.cluster, "--timeout", "10s"}
	require.Eventually(t, func() bool {
		out, err := exec.Command(bin, append(withToken, "cat", "/hello.txt")...).Output()
		return err == nil && string(out) == "hello, memfs\n"
	}, 30*time.Second, 100*time.Millisecond)
	out, err = exec.Command(bin, append(withToken, "put", local, "/by-reader.txt")...).CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "needs role write")
	require.Contains(t, runOK(t, bin, append(p.sec, "--cluster", p.cluster, "token", "list")...), id)
	require.Contains(t, runOK(t, bin, append(p.sec, "--cluster", p.cluster, "token", "revoke", id)...), "revoked token "+id)
	require.Eventually(t, func() bool {
		out, err := exec.Command(bin, append(withToken, "cat", "/hello.txt")...).CombinedOutput()
		return err != nil && strings.Contains(string(out), "unknown or revoked token")
	}, 30*time.Second, 100*time.Millisecond)

	// Status reports the answering node's state, which may lag a moment.
	require.Eventually(t, func() bool { return *waitStatus(t, bin, p).LogicalBytes == 13 },
		30*time.Second, 100*time.Millisecond)

	// The readable table names every node.
	table, err := exec.Command(bin, append(p.sec, "status", "--cluster", p.cluster)...).Output()
	require.NoError(t, err)
	for _, id := range []string{"n1", "n2", "n3"} {
		require.Contains(t, string(table), id)
	}
	require.Contains(t, string(table), "RSS")
	p.stop(t)
	for i := 1; i <= 3; i++ {
		log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("node%d.log", i)))
		require.NoError(t, err)
		require.Contains(t, string(log), "node stopped", "node %d stopped gracefully", i)
	}

	// A second run on the same dir finds the old cluster and its files
	// (no new bootstrap).
	p = startUp(t, bin, dir, base, true)
	waitStatus(t, bin, p)
	require.Equal(t, "hello, memfs\n", runOK(t, bin, append(p.sec, "--cluster", p.cluster, "cat", "/hello.txt")...))
	p.stop(t)
	log, err := os.ReadFile(filepath.Join(dir, "node1.log"))
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(log), "bootstrapped a new cluster"))
	require.Contains(t, string(log), "existing_state=true")
}

func TestNodeRemoveCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	c := servertest.StartCluster(t, 3)
	c.AddNode()
	addrs := strings.Join(c.APIAddrs()[:3], ",")
	out, err := exec.Command(bin, "node", "remove", "n4", "--cluster", addrs).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "removed node n4")
	out, err = exec.Command(bin, "status", "--json", "--cluster", addrs).Output()
	require.NoError(t, err)
	require.NotContains(t, string(out), `"n4"`)
}

func TestExitStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"node", "remove"}, 2, "memfs: accepts 1 arg"},
		{[]string{"status", "--no-such-flag"}, 2, "memfs: unknown flag"},
		{[]string{"server", "--data", "x"}, 2, "memfs: --id is required"},
		{[]string{"server", "--id", "a", "--data", "x", "--memory-limit", "lots"}, 2, "not a size"},
		{[]string{"server", "--id", "a", "--data", "x", "--gc-headroom", "-1MiB"}, 2, "--gc-headroom: \"-1MiB\" is not a size"},
		{[]string{"status", "--cluster", "127.0.0.1:1", "--timeout", "5s"}, 1, "memfs: no node answered"},
		{[]string{"up", "extra"}, 2, "memfs: up takes no arguments"},
		{[]string{"health"}, 2, "memfs: accepts 1 arg"},
		{[]string{"health", "127.0.0.1:1", "--timeout", "5s"}, 1, "connection refused"},
		// Flags after "--" reach every node: a bad one stops them.
		{[]string{"up", "--dir", t.TempDir(), "--base-port", "21000", "--", "--no-such-flag"}, 1, "exited (exit status 2)"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "want an exit error, got %v", err)
			require.Equal(t, tc.code, ee.ExitCode(), stderr.String())
			require.Contains(t, stderr.String(), tc.msg)
			require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one readable line: %q", stderr.String())
		})
	}
}

// runOK runs the binary and returns its stdout, failing on a non-zero exit.
func runOK(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "memfs %v: %s", args, stderr.String())
	return stdout.String()
}
