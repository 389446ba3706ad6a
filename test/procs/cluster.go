// Package procs runs MemoryFS as real `memfs server` processes on
// loopback, with a faultnet proxy in front of every node's Raft port (so
// every Raft link between processes can be delayed, reset or blackholed,
// per direction and per pair of nodes) and every client connection going
// through faultnet too; nodes are killed with SIGKILL and restarted on their
// data dirs.
//
// It is test code: nothing outside test/ may import it.
package procs

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/faultnet"
)

// Build compiles ./cmd/memfs into dir and returns the binary's path.
func Build(dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "memfs")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/memfs")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/memfs: %w\n%s", err, out)
	}
	return bin, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test directory")
		}
		dir = parent
	}
}

// Options shape a process cluster.
type Options struct {
	Nodes int
	Seed  int64
	// Args are extra `memfs server` flags for every node.
	Args []string
}

// Cluster is a running process cluster.
type Cluster struct {
	T   testing.TB
	Net *faultnet.Net
	bin string
	dir string
	ip  string // the nodes' loopback address (faultnet.LoopbackIP)

	mu    sync.Mutex
	nodes []*proc
}

type proc struct {
	id       string
	dataDir  string
	raftAddr string // the node binds this
	proxy    *faultnet.Proxy
	apiAddr  string
	args     []string
	logPath  string
	cmd      *exec.Cmd
	exited   chan struct{}
	ctl      *grpc.ClientConn // unfaulted control connection
}

// freePort asks the kernel for a port on ip and releases it. A node keeps
// its ports across restarts, as Raft and clients know it by them; ip is the
// cluster's own loopback address so that no other cluster can take them
// while the node is down.
func freePort(ip string) (string, error) {
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// Start launches the nodes (node 0 bootstraps, the others join it) and
// waits for every one to be a member. t.Cleanup kills them.
func Start(t testing.TB, bin string, opts Options) *Cluster {
	t.Helper()
	c := &Cluster{T: t, Net: faultnet.New(opts.Seed), bin: bin, dir: t.TempDir(), ip: faultnet.LoopbackIP()}
	c.Net.SetLogf(t.Logf)
	t.Cleanup(c.Shutdown)
	for i := 0; i < opts.Nodes; i++ {
		p, err := c.newProc(i, opts.Args)
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		c.nodes = append(c.nodes, p)
	}
	for i, p := range c.nodes {
		args := append([]string(nil), p.args...)
		if i == 0 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--join", c.nodes[0].apiAddr)
		}
		if err := c.launch(p, args); err != nil {
			t.Fatalf("start %s: %v", p.id, err)
		}
		if i == 0 {
			c.waitLeader(t, 60*time.Second)
		}
	}
	c.waitMembers(t, 60*time.Second)
	return c
}

func (c *Cluster) newProc(i int, extra []string) (*proc, error) {
	id := fmt.Sprintf("n%d", i)
	raftAddr, err := freePort(c.ip)
	if err != nil {
		return nil, err
	}
	apiAddr, err := freePort(c.ip)
	if err != nil {
		return nil, err
	}
	px, err := faultnet.NewRaftProxy(c.Net, raftAddr, id)
	if err != nil {
		return nil, err
	}
	p := &proc{id: id, dataDir: filepath.Join(c.dir, id), raftAddr: raftAddr, proxy: px, apiAddr: apiAddr,
		logPath: filepath.Join(c.dir, id+".log")}
	p.args = append([]string{"server", "--id", id, "--data", p.dataDir,
		"--raft-addr", raftAddr, "--raft-advertise", px.Addr(), "--api-addr", apiAddr,
		"--log-level", "warn", "--raft-log-level", "off", "--insecure"}, extra...)
	p.ctl, err = grpc.NewClient(apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	return p, err
}

func (c *Cluster) launch(p *proc, args []string) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(exited)
	}()
	c.mu.Lock()
	p.cmd, p.exited = cmd, exited
	c.mu.Unlock()
	return nil
}

// status asks node p about itself over the unfaulted control connection.
func (p *proc) status(ctx context.Context) (*pb.StatusResponse, error) {
	return pb.NewMemFSClient(p.ctl).Status(ctx, &pb.StatusRequest{Version: pb.Version, Local: true})
}

func (c *Cluster) waitLeader(t testing.TB, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l >= 0 {
			return l
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.dumpLogs(t)
	t.Fatalf("no leader within %v", timeout)
	return -1
}

// waitMembers polls until a leader reports every node as a member.
func (c *Cluster) waitMembers(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			st, err := pb.NewMemFSClient(c.nodes[l].ctl).Status(ctx, &pb.StatusRequest{Version: pb.Version})
			cancel()
			if err == nil && len(st.GetNodes()) == len(c.nodes) {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.dumpLogs(t)
	t.Fatalf("the cluster did not reach %d members within %v", len(c.nodes), timeout)
}

// Network implements workload.Target.
func (c *Cluster) Network() *faultnet.Net { return c.Net }

// NodeIDs implements workload.Target.
func (c *Cluster) NodeIDs() []string {
	out := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		out[i] = p.id
	}
	return out
}

// CanLoseAll implements workload.Target: the nodes keep their Raft state
// on disk.
func (c *Cluster) CanLoseAll() bool { return true }

// Leader implements workload.Target: a running node whose Raft state is
// Leader.
func (c *Cluster) Leader() int {
	for _, i := range c.Up() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		st, err := c.nodes[i].status(ctx)
		cancel()
		if err == nil && st.GetSelf().GetState() == "Leader" {
			return i
		}
	}
	return -1
}

// Up implements workload.Target.
func (c *Cluster) Up() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, p := range c.nodes {
		if p.cmd != nil {
			select {
			case <-p.exited:
			default:
				out = append(out, i)
			}
		}
	}
	return out
}

// Crash implements workload.Target with SIGKILL.
func (c *Cluster) Crash(i int) {
	c.mu.Lock()
	p := c.nodes[i]
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	c.Net.Logf("procs: kill -9 %s", p.id)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	// The peers' connections to the dead process die with it.
	c.Net.ResetConns(p.id)
}

// Restart implements workload.Target: the node starts again on its data
// dir, with neither --bootstrap nor --join.
func (c *Cluster) Restart(i int) error {
	p := c.nodes[i]
	c.Net.Logf("procs: restart %s", p.id)
	if err := c.launch(p, p.args); err != nil {
		return err
	}
	// Wait until it answers, so a crash right after hits a running node.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := p.status(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited after restart; log %s", p.id, p.logPath)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer within 30s of its restart; log %s", p.id, p.logPath)
}

// APIAddrs returns every node's API address.
func (c *Cluster) APIAddrs() []string {
	out := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		out[i] = p.apiAddr
	}
	return out
}

func (c *Cluster) idOfAddr(addr string) string {
	for _, p := range c.nodes {
		if p.apiAddr == addr {
			return p.id
		}
	}
	return addr
}

// Dialer returns a client dialer whose connections are the links from
// endpoint name to each node in the Net.
func (c *Cluster) Dialer(name string) client.Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return c.Net.Dial(ctx, name, c.idOfAddr(addr), addr)
	}
}

// Client connects a client named name (its endpoint in the Net); opts
// come after the defaults, so they may replace the dialer.
func (c *Cluster) Client(ctx context.Context, name string, opts ...client.Option) (*client.Client, error) {
	opts = append([]client.Option{client.WithDialer(c.Dialer(name)), client.WithName(name)}, opts...)
	return client.New(ctx, c.APIAddrs(), opts...)
}

// Shutdown kills every node and closes the proxies.
func (c *Cluster) Shutdown() {
	for i := range c.nodes {
		c.Crash(i)
	}
	for _, p := range c.nodes {
		_ = p.proxy.Close()
		_ = p.ctl.Close()
	}
	c.Net.ResetConns("")
	if c.T.Failed() {
		c.dumpLogs(c.T)
	}
}

// dumpLogs prints the end of every node's log.
func (c *Cluster) dumpLogs(t testing.TB) {
	for _, p := range c.nodes {
		b, err := os.ReadFile(p.logPath)
		if err != nil {
			continue
		}
		s := string(b)
		if len(s) > 3000 {
			s = "…" + s[len(s)-3000:]
		}
		t.Logf("log of %s (%s):\n%s", p.id, p.logPath, s)
	}
}
