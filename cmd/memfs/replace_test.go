package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/internal/progress"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// spareNode is a `memfs server` process started with neither --bootstrap
// nor --join: it waits to be added.
type spareNode struct {
	ID, RaftAddr, APIAddr string
	cmd                   *exec.Cmd
	out                   *syncBuffer
	done                  chan struct{}
}

func (s *spareNode) with() string { return s.ID + "@" + s.RaftAddr + "," + s.APIAddr }

func startSpare(t *testing.T, bin, id string) *spareNode {
	t.Helper()
	ports := freePorts(t, 2)
	return startSpareAt(t, bin, id, ports[0], ports[1])
}

func startSpareAt(t *testing.T, bin, id, raftAddr, apiAddr string) *spareNode {
	t.Helper()
	s := &spareNode{ID: id, RaftAddr: raftAddr, APIAddr: apiAddr, out: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, "server", "--id", id, "--data", filepath.Join(t.TempDir(), id),
		"--raft-addr", s.RaftAddr, "--api-addr", s.APIAddr, "--memory-limit", "1GiB", "--insecure")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	require.NoError(t, s.cmd.Start())
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
	require.Eventually(t, func() bool {
		_, err := replace.LocalStatus(context.Background(), replace.Net{}, s.APIAddr)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "spare node never answered: %s", s.out)
	require.Contains(t, s.out.String(), "waiting to be added")
	return s
}

// freePorts returns n loopback addresses free right now.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var held []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		held = append(held, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range held {
		l.Close()
	}
	return out
}

// steadyWriter writes small files of distinct content one after the other
// and remembers which ones the cluster acknowledged.
type steadyWriter struct {
	mu      sync.Mutex
	acked   map[string][]byte
	errs    []error
	lat     []time.Duration // latency of each acknowledged write
	at      []time.Time     // when each acknowledged write started
	stop    chan struct{}
	stopped chan struct{}
}

func startWriter(t testing.TB, addrs []string, period time.Duration) *steadyWriter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := client.New(ctx, addrs)
	require.NoError(t, err)
	require.NoError(t, cli.MkdirAll("/w", 0o755))
	w := &steadyWriter{acked: map[string][]byte{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(w.stopped)
		defer cli.Close()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			name := fmt.Sprintf("/w/%06d", i)
			data := bytes.Repeat([]byte(fmt.Sprintf("%s:%d;", name, i)), 400)
			start := time.Now()
			err := cli.WriteFile(name, data, 0o644)
			took := time.Since(start)
			w.mu.Lock()
			if err != nil {
				w.errs = append(w.errs, fmt.Errorf("write %s: %w", name, err))
			} else {
				w.acked[name] = data
				w.lat = append(w.lat, took)
				w.at = append(w.at, start)
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *steadyWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func (w *steadyWriter) finish() {
	close(w.stop)
	<-w.stopped
}

// preload writes distinct data so the new node has something to catch up.
func preload(t *testing.T, addrs []string, files, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli, err := client.New(ctx, addrs)
	require.NoError(t, err)
	defer cli.Close()
	require.NoError(t, cli.MkdirAll("/pre", 0o755))
	for i := range files {
		// Distinct random bytes: block dedup must not shrink the state.
		data := make([]byte, size)
		rng := rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), byte(i >> 16)})
		_, _ = rng.Read(data)
		require.NoError(t, cli.WriteFile(fmt.Sprintf("/pre/%04d", i), data, 0o644))
	}
}

func TestNodeReplaceUnderWriteLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	for _, tc := range []struct {
		name   string
		leader bool // replace the leader, else a follower
		dead   bool // crash it first: the usual reason for a replacement
	}{
		{"follower", false, false},
		{"leader", true, false},
		{"dead follower", false, true},
		{"dead leader", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := memfsBinary(t)
			c := servertest.StartCluster(t, 3)
			leader := c.WaitLeader(10 * time.Second)
			old := leader
			if !tc.leader {
				for _, n := range c.Nodes() {
					if n != leader {
						old = n
						break
					}
				}
			}
			oldID, oldIdx := old.ID(), c.Index(old)
			addrs := c.APIAddrs()
			preload(t, addrs, 64, 64<<10)
			spare := startSpare(t, bin, "n4")

			w := startWriter(t, addrs, 10*time.Millisecond)
			require.Eventually(t, func() bool { return w.count() >= 20 }, 30*time.Second, 10*time.Millisecond)
			if tc.dead {
				c.Kill(oldIdx)
				n := w.count()
				require.Eventually(t, func() bool { return w.count() >= n+20 }, 30*time.Second, 10*time.Millisecond)
			}
			before := w.count()

			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, "node", "replace", oldID, "--with", spare.with(),
				"--cluster", strings.Join(addrs, ","), "--stable", "1s", "--catch-up-timeout", "2m")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "stdout:\n%s\nstderr:\n%s\nspare:\n%s", &stdout, &stderr, spare.out)
			require.Contains(t, stdout.String(), fmt.Sprintf("replaced %s with n4", oldID))
			require.Contains(t, stderr.String(), "n4 caught up")
			require.NotContains(t, stderr.String(), "n4 log", "into a pipe: the steps, no progress")
			require.NotContains(t, stderr.String(), "\r")
			if tc.leader && !tc.dead && !strings.Contains(stderr.String(), "hands leadership over") {
				// An election on this loaded machine moved leadership first.
				t.Logf("%s no longer led at its removal", oldID)
			}
			// The writer goes on after the old node is gone.
			during := w.count()
			c.Kill(oldIdx)
			require.Eventually(t, func() bool { return w.count() >= during+20 }, 30*time.Second, 10*time.Millisecond)
			w.finish()
			require.Empty(t, w.errs, "a write failed")
			require.Greater(t, during, before, "writes went on during the replacement")

			// Exactly the expected voters, no one else.
			var newAddrs []string
			want := []string{"n4"}
			for _, n := range c.Nodes() {
				newAddrs = append(newAddrs, n.APIAddr())
				want = append(want, n.ID())
			}
			newAddrs = append(newAddrs, spare.APIAddr)
			sort.Strings(want)
			st := statusOf(t, newAddrs)
			var voters []string
			for _, n := range st.Nodes {
				require.True(t, n.Voter, "%s is not a voter", n.Id)
				voters = append(voters, n.Id)
			}
			require.Equal(t, want, voters)
			require.NotEqual(t, oldID, st.Leader)

			// Every acknowledged write reads back from the new membership,
			// and the new node holds the same state as the leader.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cli, err := client.New(ctx, newAddrs)
			require.NoError(t, err)
			defer cli.Close()
			for name, data := range w.acked {
				got, err := cli.ReadFile(name)
				require.NoError(t, err, name)
				require.Equal(t, data, got, name)
			}
			// The leader may be the new node itself (a leader removing itself
			// hands over to the most up-to-date voter), so the reference is a
			// surviving in-process member that has applied what every member
			// had applied.
			var top uint64
			for _, n := range statusOf(t, newAddrs).Nodes {
				top = max(top, n.AppliedIndex)
			}
			c.WaitApplied(top, 20*time.Second)
			ref := c.Nodes()[0]
			require.Eventually(t, func() bool {
				self, err := replace.LocalStatus(ctx, replace.Net{}, spare.APIAddr)
				return err == nil && self.AppliedIndex >= ref.AppliedIndex() &&
					self.LogicalBytes == ref.FSM().Stats().LogicalBytes
			}, 20*time.Second, 20*time.Millisecond)
		})
	}
}

func TestNodeReplaceFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	addrs := c.APIAddrs()
	cluster := strings.Join(addrs, ",")
	run := func(args ...string) (string, int) {
		var stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"node", "replace", "--cluster", cluster}, args...)...)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return stderr.String(), ee.ExitCode()
		}
		require.NoError(t, err)
		return stderr.String(), 0
	}
	nobody := freePorts(t, 2)

	// Usage mistakes: exit status 2.
	msg, code := run(leader.ID())
	require.Equal(t, 2, code, msg)
	require.Contains(t, msg, "--with")
	msg, code = run(leader.ID(), "--with", "n4")
	require.Equal(t, 2, code, msg)

	// The new node is not running: nothing changes.
	msg, code = run(leader.ID(), "--with", "n4@"+nobody[0]+","+nobody[1], "--timeout", "3s")
	require.Equal(t, 1, code, msg)
	require.Contains(t, msg, "memfs: nothing changed: new node n4 unreachable")
	require.NotContains(t, msg, "is the cluster running")
	require.Len(t, statusOf(t, addrs).Nodes, 3)

	// A node that is not a member cannot be replaced.
	spare := startSpare(t, bin, "n4")
	msg, code = run("n9", "--with", spare.with())
	require.Equal(t, 1, code, msg)
	require.Contains(t, msg, "nothing changed: n9 is not a member")

	// The leader cannot reach the new node's Raft address: it is added as
	// a non-voter, never catches up, and the message says so.
	msg, code = run(leader.ID(), "--with", "n4@"+nobody[0]+","+spare.APIAddr, "--catch-up-timeout", "2s", "--stable", "200ms")
	require.Equal(t, 1, code, msg)
	require.Contains(t, msg, "memfs: n4 added as non-voter but not promoted: n4 did not catch up within 2s")
	st := statusOf(t, addrs)
	require.Len(t, st.Nodes, 4)
	n4 := replace.FindNode(st, "n4")
	require.NotNil(t, n4)
	require.False(t, n4.Voter)
	require.Equal(t, leader.ID(), st.Leader, "the leader stayed")

	// Undo as the message says; then the replacement with the right
	// address goes through.
	out, err := exec.Command(bin, "node", "remove", "n4", "--cluster", cluster).CombinedOutput()
	require.NoError(t, err, "%s", out)
	follower := ""
	for _, n := range c.Nodes() {
		if n != leader {
			follower = n.ID()
		}
	}
	msg, code = run(follower, "--with", spare.with(), "--stable", "200ms")
	require.Equal(t, 0, code, msg)
	st = statusOf(t, addrs)
	require.Len(t, st.Nodes, 3)
	require.NotNil(t, replace.FindNode(st, "n4"))
	require.Nil(t, replace.FindNode(st, follower))
}

// A run stopped after the new node was added resumes where it stopped.
func TestNodeReplaceResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	c := servertest.StartCluster(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	spare := startSpare(t, bin, "n4")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := c.Client(leader.APIAddr()).Join(ctx, &pb.JoinRequest{Version: pb.Version, Id: spare.ID,
		RaftAddr: spare.RaftAddr, ApiAddr: spare.APIAddr, Nonvoter: true})
	require.NoError(t, err)

	cmd := exec.Command(bin, "node", "replace", leader.ID(), "--with", spare.with(),
		"--cluster", strings.Join(c.APIAddrs(), ","), "--stable", "200ms")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "n4 is already a member (voter: false); resuming")
	require.NotContains(t, string(out), "adding n4")
	st := statusOf(t, c.APIAddrs())
	require.Len(t, st.Nodes, 3)
	require.True(t, replace.FindNode(st, "n4").Voter)
	require.Nil(t, replace.FindNode(st, leader.ID()))
}

func statusOf(t *testing.T, addrs []string) *pb.StatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var st *pb.StatusResponse
	require.NoError(t, replace.CallAddrs(ctx, replace.Net{}, addrs, func(ctx context.Context, c pb.MemFSClient) error {
		var err error
		st, err = c.Status(ctx, &pb.StatusRequest{Version: pb.Version})
		return err
	}))
	slices.SortFunc(st.Nodes, func(a, b *pb.NodeStatus) int { return strings.Compare(a.Id, b.Id) })
	return st
}

func TestReplaceProgressLine(t *testing.T) {
	log := func(applied, commit uint64) replace.Progress {
		return replace.Progress{Self: &pb.NodeStatus{AppliedIndex: applied}, Commit: commit, Lag: commit - applied}
	}
	syncing := func(fetched, wanted uint64, restoring bool) replace.Progress {
		return replace.Progress{Self: &pb.NodeStatus{Restoring: restoring, SyncBlocksWanted: 64, SyncBlocksFetched: 16,
			SyncBytesWanted: wanted, SyncBytesFetched: fetched}, Commit: 100, Lag: 100}
	}
	type bar struct {
		phase string
		total int64
	}
	cases := []struct {
		name string
		seq  []replace.Progress
		bars []bar
	}{
		{"log replay only: one bar, kept open as the log grows", []replace.Progress{log(0, 100), log(90, 150), log(150, 150)},
			[]bar{{"log", 100}}},
		{"a snapshot: log, block sync, log again", []replace.Progress{
			log(0, 1280), syncing(0, 0, true), syncing(1<<20, 4<<20, true), syncing(4<<20, 4<<20, false), log(1500, 1600),
		}, []bar{{"log", 1280}, {"sync", 1}, {"log", 100}}}, // the restore ended at the fourth reading
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Into a buffer (a file or a pipe): only the steps.
			var out bytes.Buffer
			p := newProgressLine(&out, "n4")
			real := p.newBar
			var bars []bar
			p.newBar = func(phase string, total int64) *progress.Bar {
				bars = append(bars, bar{phase, total})
				return real(phase, total)
			}
			p.note("adding n4")
			for _, pr := range tc.seq {
				p.show(pr)
			}
			p.note("n4 caught up")
			p.endLine()
			require.Equal(t, "adding n4\nn4 caught up\n", out.String(), "no progress outside a terminal")
			require.Equal(t, tc.bars, bars)

			// --quiet: no bar is even made.
			out.Reset()
			p = newProgressLine(&out, "n4")
			p.quiet = true
			p.newBar = func(string, int64) *progress.Bar { t.Fatal("a bar with --quiet"); return nil }
			for _, pr := range tc.seq {
				p.show(pr)
			}
			require.Empty(t, out.String())
		})
	}
}

// TestNodeReplaceProgressOnATerminal runs memfs node replace in tmux on a
// cluster whose leader has cut its log, so that the new node restores a
// snapshot and fetches the blocks by block sync: a bar of the bytes
// fetched and then one of the log, each with its rate and the time left,
// then the summary; with --quiet the same command writes only the steps.
func TestNodeReplaceProgressOnATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	tm := newTmux(t)
	bin := memfsBinary(t)
	c := servertest.StartCluster(t, 3, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Raft.SnapshotThreshold, cfg.Raft.TrailingLogs, cfg.Raft.SnapshotInterval = 32, 8, 200*time.Millisecond
	}))
	leader := c.WaitLeader(10 * time.Second)
	var followers []string
	for _, n := range c.Nodes() {
		if n != leader {
			followers = append(followers, n.ID())
		}
	}
	addrs := c.APIAddrs()
	preload(t, addrs, 96, 1<<20)
	require.Eventually(t, func() bool { return leader.Raft().Stats()["last_snapshot_index"] != "0" },
		60*time.Second, 50*time.Millisecond, "the leader never took a snapshot: %v", leader.Raft().Stats())
	w := startWriter(t, addrs, 10*time.Millisecond)
	defer w.finish()

	replaceCmd := func(old string, spare *spareNode, flags string) string {
		return fmt.Sprintf("%s node replace %s --with %s --cluster %s --stable 1s %s; echo status=$?; sleep 600",
			bin, old, spare.with(), strings.Join(addrs, ","), flags)
	}
	n4 := startSpare(t, bin, "n4")
	tm.run("replace", replaceCmd(followers[0], n4, ""), 160, 40)
	screen := tm.waitScreen("replace", "status=", 5*time.Minute)
	t.Logf("the terminal shows:\n%s", screen)
	require.Contains(t, screen, "status=0")
	require.Contains(t, screen, fmt.Sprintf("replaced %s with n4", followers[0]))
	require.Regexp(t, `n4 block sync +100% .*\([0-9.]+/[0-9.]+ [KMG]?i?B, [0-9.]+ [KMG]?i?B/s\)`, screen,
		"a bar of the bytes fetched, complete, with the rate")
	require.Regexp(t, `n4 log [0-9]+/[0-9]+ \(lag [0-9]+\) +[0-9]+% .*\([0-9]+ entries/(s|min|hr)\) \[[0-9hms]+:[0-9hms]+\]`, screen,
		"a bar of the log with the rate, the time spent and the time left")
	require.Less(t, strings.Index(screen, "n4 block sync"), strings.LastIndex(screen, "n4 log"), "the log after the restore")

	// --quiet on a terminal: only the steps and the summary.
	n5 := startSpare(t, bin, "n5")
	tm.run("quiet", replaceCmd(followers[1], n5, "--quiet"), 160, 40)
	screen = tm.waitScreen("quiet", "status=", 5*time.Minute)
	require.Contains(t, screen, "status=0")
	require.Contains(t, screen, fmt.Sprintf("replaced %s with n5", followers[1]))
	require.NotContains(t, screen, "block sync ")
	require.NotContains(t, screen, "n5 log")
	require.NotContains(t, screen, "%")
}
