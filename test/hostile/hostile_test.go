// Package hostile_test attacks a real 3-node cluster over TLS the way a
// hostile client on the network could, and checks that honest clients
// and the nodes come through. It runs in the fault suite (without the race
// detector: thousands of connections).
package hostile_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/proto"
	"github.com/memoryfs/memfs/server"
)

// scripts/hostilep99.sh sets these to measure the honest client's p99 on
// a quiet machine against the goal (at most 3 times the idle p99).
var (
	honestOps = flag.Int("hostile.ops", 200, "honest write+read pairs timed on the idle cluster and again under attack")
	maxP99x   = flag.Float64("hostile.maxp99x", 0, "fail when the honest p99 under attack is more than this multiple of the idle p99 (0: only log it)")
)

func tlsClient(t *testing.T, c *server.Cluster) *client.Client {
	t.Helper()
	cl, err := client.New(context.Background(), c.APIAddrs(), client.WithTLS(c.ClientTLS("admin").ClientConfig()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestHostileClients attacks a 3-node TLS cluster on both ports while an
// honest client writes and reads: idle connections by the thousand,
// garbage bytes, TLS that never finishes (slow loris), an HTTP/2 frame
// declaring 16 MiB, wrong and expired certificates, an authenticated
// client that opens reads and never takes the data, and a client with a
// token for another path prefix. No honest operation may fail or return other bytes, every node must stay up, and the heap
// must stay bounded. The honest client's latencies with and without the
// attack are logged (docs/security.md records them).
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of connections")
	}
	// The default limits, the 10 s handshake timeout included.
	c := server.StartCluster(t, 3, server.WithTLS())
	honest := tlsClient(t, c)
	ctx := context.Background()
	big := make([]byte, 8<<20)
	_, _ = rand.Read(big)
	require.NoError(t, honest.WriteFile("/big", big, 0o644))

	work := func(phase string, n int) []time.Duration {
		var lat []time.Duration
		for i := range n {
			name := fmt.Sprintf("/%s-%d", phase, i)
			data := []byte(name)
			start := time.Now()
			require.NoError(t, honest.WriteFile(name, data, 0o644))
			got, err := honest.ReadFile(name)
			require.NoError(t, err)
			lat = append(lat, time.Since(start))
			require.Equal(t, data, got)
		}
		slices.Sort(lat)
		return lat
	}
	p99 := func(l []time.Duration) time.Duration { return l[len(l)*99/100] }
	idleLat := work("idle", *honestOps)

	var heapBefore runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heapBefore)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var attacks atomic.Int64
	loop := func(f func()) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				f()
				attacks.Add(1)
			}
		})
	}
	var targets []string
	for _, n := range c.Nodes() {
		targets = append(targets, n.APIAddr(), n.RaftAddr())
	}
	// 10,000 idle connections held by another process (this one has
	// file descriptors for the nodes' ends only), reopened as soon as a
	// node drops one.
	idle := idleBudget(10000)
	attacker := startIdleAttacker(t, idle, c.APIAddrs())
	// And 100 on each API port and 40 on each Raft port from here, each
	// of which the node must drop.
	var idleConns []net.Conn
	for _, n := range c.Nodes() {
		for i := range 140 {
			addr := n.APIAddr()
			if i >= 100 {
				addr = n.RaftAddr()
			}
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			idleConns = append(idleConns, conn)
		}
	}
	garbage := make([]byte, 4096)
	_, _ = rand.Read(garbage)
	for _, addr := range targets {
		loop(func() { // garbage bytes
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return
			}
			_, _ = conn.Write(garbage)
			server.ClosedWithin(conn, 5*time.Second)
			_ = conn.Close()
		})
		loop(func() { // slow loris: the start of a TLS record, then nothing
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte{0x16, 0x03, 0x01, 0x02})
			server.ClosedWithin(conn, 20*time.Second)
			_ = conn.Close()
		})
	}
	caOnly, err := tlsconf.Load(tlsconf.Files{CA: c.CertFiles("admin").CA}, nil)
	require.NoError(t, err)
	for _, n := range c.Nodes() {
		addr := n.APIAddr()
		loop(func() { // a frame declaring 16 MiB after the HTTP/2 preface
			cfg := caOnly.ClientConfig()
			cfg.ServerName, cfg.NextProtos = "127.0.0.1", []string{"h2"}
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, cfg)
			if err != nil {
				return
			}
			var b bytes.Buffer
			b.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
			b.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})          // empty SETTINGS
			b.Write([]byte{0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1}) // DATA, 16 MiB declared
			_, _ = conn.Write(b.Bytes())
			server.ClosedWithin(conn, 5*time.Second)
			_ = conn.Close()
		})
		loop(func() { // no certificate, no token
			conn, err := client.New(ctx, []string{addr}, client.WithTLS(caOnly.ClientConfig()), client.WithRetryTimeout(time.Second))
			// Refused, or out of time on a busy machine; never served.
			if err == nil {
				_ = conn.Close()
				t.Error("a client without credentials opened a session")
			} else if code := status.Code(err); code != codes.Unauthenticated && code != codes.DeadlineExceeded && code != codes.Unknown {
				t.Errorf("want Unauthenticated, got %v", err)
			}
		})
	}
	// A token for another path prefix, guessing inode and handle numbers.
	mallory := newPrefixAttacker(t, c, honest)
	var guess atomic.Uint64
	loop(func() {
		for _, l := range mallory.attack(ctx, guess.Add(1)%mallory.maxIno+1) {
			t.Error(l)
		}
	})
	// Authenticated slow readers: streams of /big nobody reads.
	slow := tlsClient(t, c)
	for range 20 {
		f, err := slow.Open("/big")
		require.NoError(t, err)
		defer f.Close()
		_, err = f.Read(make([]byte, 1))
		require.NoError(t, err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	for _, n := range c.Nodes() {
		for range 5 {
			stream, err := c.Client(n.APIAddr()).Read(rctx, &pb.QueryRequest{Version: pb.Version,
				Query:       &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: "/big"}, Length: 8 << 20}}},
				Consistency: pb.Consistency_STALE})
			require.NoError(t, err)
			_, err = stream.Recv() // one frame, then never again
			require.NoError(t, err)
		}
	}

	attackLat := work("attack", *honestOps)
	var heapDuring runtime.MemStats
	runtime.ReadMemStats(&heapDuring)
	close(stop)
	wg.Wait()
	rcancel()
	reopened := attacker.stop()
	require.Greater(t, reopened, int64(0), "the nodes dropped none of the attacker's idle connections")

	// Every idle connection was dropped by the handshake timeout.
	closed := 0
	for _, conn := range idleConns {
		if server.ClosedWithin(conn, 30*time.Second) {
			closed++
		}
		_ = conn.Close()
	}
	require.Equal(t, len(idleConns), closed, "idle connections the nodes kept")
	for i := range c.Size() {
		require.NotNil(t, c.Node(i), "node %d", i)
	}
	lead := c.WaitLeader(30 * time.Second)
	c.WaitApplied(lead.AppliedIndex(), 60*time.Second)
	got, err := honest.ReadFile("/big")
	require.NoError(t, err)
	require.Equal(t, big, got)

	grew := int64(heapDuring.HeapInuse) - int64(heapBefore.HeapInuse)
	t.Logf("attacks made: %d; idle conns: %d from another process (%d reopened after a node dropped them) and %d from this one; heap in use %d MiB before, %d MiB under attack (3 nodes and the in-process attackers)",
		attacks.Load(), idle, reopened, len(idleConns), heapBefore.HeapInuse>>20, heapDuring.HeapInuse>>20)
	t.Logf("honest write+read p50/p99: idle %v/%v, under attack %v/%v (x%.1f at p99)",
		idleLat[len(idleLat)/2], p99(idleLat), attackLat[len(attackLat)/2], p99(attackLat),
		float64(p99(attackLat))/float64(p99(idleLat)))
	require.Less(t, grew, int64(1<<30), "the heap grew without bound under attack")
	if *maxP99x > 0 {
		require.LessOrEqual(t, float64(p99(attackLat))/float64(p99(idleLat)), *maxP99x,
			"the honest client's p99 under attack against the idle cluster's")
	}
}

// idleBudget is want, or fewer where the open-file limit (which the nodes'
// ends of the connections count against in this process) is lower.
func idleBudget(want int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return want
	}
	return max(100, min(want, int(lim.Cur)-3000))
}

// idleAttacker is the process that holds idle connections.
type idleAttacker struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startIdleAttacker runs this test binary as TestIdleAttacker holding n
// connections to addrs, and returns once they are open.
func startIdleAttacker(t *testing.T, n int, addrs []string) *idleAttacker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleAttacker$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("MEMFS_HOSTILE_IDLE=%d", n), "MEMFS_HOSTILE_ADDRS="+strings.Join(addrs, ","))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	a := &idleAttacker{t: t, cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		for a.out.Scan() {
			if a.out.Text() == "ready" {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "the attacker process ended before its connections were open")
	case <-time.After(60 * time.Second):
		t.Fatal("the attacker process did not open its connections within 60 s")
	}
	return a
}

// stop ends the attacker and returns how many connections it reopened.
func (a *idleAttacker) stop() int64 {
	_ = a.stdin.Close()
	var reopened int64
	for a.out.Scan() {
		if v, ok := strings.CutPrefix(a.out.Text(), "reopened "); ok {
			reopened, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	require.NoError(a.t, a.cmd.Wait())
	return reopened
}

// TestIdleAttacker is not a test of its own: TestHostileClients runs the
// test binary as this, with MEMFS_HOSTILE_IDLE connections to hold to the
// MEMFS_HOSTILE_ADDRS, each reopened when a node drops it, until stdin
// closes.
func TestIdleAttacker(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("MEMFS_HOSTILE_IDLE"))
	if n == 0 {
		t.Skip("the attacker process of TestHostileClients")
	}
	addrs := strings.Split(os.Getenv("MEMFS_HOSTILE_ADDRS"), ",")
	var opened, reopened atomic.Int64
	done := make(chan struct{})
	for i := range n {
		addr := addrs[i%len(addrs)]
		go func() {
			for first := true; ; first = false {
				select {
				case <-done:
					return
				default:
				}
				conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					continue
				}
				if first {
					opened.Add(1)
				} else {
					reopened.Add(1)
				}
				_, _ = io.Copy(io.Discard, conn) // until the node drops it
				_ = conn.Close()
			}
		}()
	}
	require.Eventually(t, func() bool { return opened.Load() == int64(n) }, 60*time.Second, 10*time.Millisecond)
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	close(done)
	fmt.Printf("reopened %d\n", reopened.Load())
}
