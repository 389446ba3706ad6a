// Package servertest runs clusters of in-process MemoryFS nodes on loopback
// TCP for tests of any package (like net/http/httptest). It is its own
// package so that the memfs binary does not link the testing package.
package servertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
)

// ClusterOption adjusts StartCluster.
type ClusterOption func(*clusterSetup)

type clusterSetup struct {
	configure []func(i int, c *server.Config)
	restart   []func(i int, c *server.Config)
	tls       bool
}

// WithTLS runs the cluster over TLS: a CA, a certificate per node and an
// "admin" client certificate are made in a temporary directory
// (Cluster.CertDir), and Cluster.Client dials with the admin certificate.
func WithTLS() ClusterOption {
	return func(s *clusterSetup) { s.tls = true }
}

// WithNodeConfig adjusts each node's Config before its first start (i
// counts from 0 in start order, nodes added by AddNode included).
func WithNodeConfig(f func(i int, c *server.Config)) ClusterOption {
	return func(s *clusterSetup) { s.configure = append(s.configure, f) }
}

// WithRestartConfig adjusts node i's Config before each Restart. c holds
// the config of its previous run (same data dir, stores, transport and
// addresses); replace, for example, a crashed node's transport here. The
// Raft address must stay the same.
func WithRestartConfig(f func(i int, c *server.Config)) ClusterOption {
	return func(s *clusterSetup) { s.restart = append(s.restart, f) }
}

// WithEphemeral keeps every node's Raft state in memory.
func WithEphemeral() ClusterOption {
	return WithNodeConfig(func(_ int, c *server.Config) { c.Ephemeral = true })
}

// WithLogStore selects the log store of every node.
func WithLogStore(kind string) ClusterOption {
	return WithNodeConfig(func(_ int, c *server.Config) { c.LogStore = kind })
}

// Cluster is a set of in-process nodes on loopback TCP, for tests.
type Cluster struct {
	t     testing.TB
	setup clusterSetup

	mu    sync.Mutex
	nodes []*server.Node  // nil for a stopped node; guarded by mu
	cfgs  []server.Config // last config of each node; guarded by mu
	conns map[string]*grpc.ClientConn

	certDir string // WithTLS: the cluster's certificates
	dir     string // the nodes' data directories are made in it
	ca      *pki.Pair
	tlsCtx  context.Context
	stopTLS context.CancelFunc // ends the sources' Watch
}

// StartCluster starts n nodes on 127.0.0.1 with random ports and data dirs
// in t.TempDir(): node 0 bootstraps, the others join. It returns once all
// have joined and a leader can serve linearizable reads; t.Cleanup stops
// them.
func StartCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	c := &Cluster{t: t, conns: map[string]*grpc.ClientConn{}}
	for _, o := range opts {
		o(&c.setup)
	}
	if c.setup.tls {
		c.certDir = t.TempDir()
		if err := pki.ClusterSetup(c.certDir, nil, nil); err != nil {
			t.Fatalf("make certificates: %v", err)
		}
		ca, err := pki.LoadCA(c.certDir)
		if err != nil {
			t.Fatalf("load CA: %v", err)
		}
		c.ca = ca
		ctx, cancel := context.WithCancel(context.Background())
		c.tlsCtx, c.stopTLS = ctx, cancel
	}
	// Made before Shutdown is registered, so removed after it runs
	// (cleanups run last first): a node still running would write into
	// a directory being removed.
	c.dir = t.TempDir()
	t.Cleanup(c.Shutdown)
	c.startNode(0, nil)
	c.WaitLeader(30 * time.Second)
	for i := 1; i < n; i++ {
		c.startNode(i, c.APIAddrs())
	}
	c.WaitLeader(30 * time.Second)
	return c
}

// Logger is the log of servertest's nodes, for a test's own parts: warnings
// and errors to stderr; MEMFS_TEST_LOG=debug or info shows more.
func Logger() *slog.Logger {
	level := slog.LevelWarn
	_ = level.UnmarshalText([]byte(os.Getenv("MEMFS_TEST_LOG")))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func (c *Cluster) newConfig(i int) server.Config {
	id := fmt.Sprintf("n%d", i+1)
	dir, err := os.MkdirTemp(c.dir, id+"-")
	if err != nil {
		c.t.Fatalf("data directory: %v", err)
	}
	cfg := server.Config{
		ID: id, DataDir: filepath.Join(dir, id),
		RaftAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		Logger: Logger(), RaftLogLevel: os.Getenv("MEMFS_TEST_RAFT_LOG"),
	}
	if cfg.RaftLogLevel == "" {
		cfg.RaftLogLevel = "error" // joins and elections warn by design
	}
	if c.certDir != "" {
		cfg.TLS = c.NodeTLS(id)
	}
	for _, f := range c.setup.configure {
		f(i, &cfg)
	}
	return cfg
}

// startNode starts node i, fresh when it has never run, else from its
// previous config and addresses; join lists the members to ask.
func (c *Cluster) startNode(i int, join []string) *server.Node {
	c.t.Helper()
	c.mu.Lock()
	var cfg server.Config
	restart := i < len(c.cfgs)
	if restart {
		cfg = c.cfgs[i]
		cfg.Bootstrap = false
	} else {
		cfg = c.newConfig(i)
		cfg.Bootstrap = i == 0
		c.cfgs = append(c.cfgs, cfg)
		c.nodes = append(c.nodes, nil)
	}
	c.mu.Unlock()
	if restart {
		for _, f := range c.setup.restart {
			f(i, &cfg)
		}
	}
	cfg.Join = join
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := server.New(ctx, cfg)
	if err != nil {
		c.t.Fatalf("start node %s: %v", cfg.ID, err)
	}
	// A restart must come back on the same addresses: Raft knows the node
	// by its raft address, the other nodes by its API address.
	cfg.RaftAddr, cfg.APIAddr, cfg.Join = n.RaftAddr(), n.APIAddr(), nil
	c.mu.Lock()
	c.nodes[i], c.cfgs[i] = n, cfg
	c.mu.Unlock()
	return n
}

// Node returns node i, or nil when it is stopped.
func (c *Cluster) Node(i int) *server.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Size is the number of nodes ever started (stopped ones included).
func (c *Cluster) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// Nodes returns the running nodes.
func (c *Cluster) Nodes() []*server.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*server.Node
	for _, n := range c.nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

// Index returns the position of node n in the cluster, or -1.
func (c *Cluster) Index(n *server.Node) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// APIAddrs returns the API addresses of the running nodes.
func (c *Cluster) APIAddrs() []string {
	var out []string
	for _, n := range c.Nodes() {
		out = append(out, n.APIAddr())
	}
	return out
}

// Leader returns a running node that is leader and ready to serve
// linearizable reads, or nil.
func (c *Cluster) Leader() *server.Node {
	for _, n := range c.Nodes() {
		if n.IsLeader() && n.LeaderReady() {
			return n
		}
	}
	return nil
}

// WaitLeader polls until a ready leader exists and returns it; it fails
// the test after timeout.
func (c *Cluster) WaitLeader(timeout time.Duration) *server.Node {
	c.t.Helper()
	deadline := time.After(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if l := c.Leader(); l != nil {
			return l
		}
		select {
		case <-tick.C:
		case <-deadline:
			c.t.Fatalf("no leader within %v", timeout)
		}
	}
}

// WaitApplied polls until every running node has applied index.
func (c *Cluster) WaitApplied(index uint64, timeout time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, n := range c.Nodes() {
		if err := n.WaitApplied(ctx, index); err != nil {
			c.t.Fatalf("node %s applied %d, want %d: %v", n.ID(), n.AppliedIndex(), index, err)
		}
	}
}

// Kill crashes node i (no leadership transfer); its data stays for Restart.
func (c *Cluster) Kill(i int) {
	if n := c.take(i); n != nil {
		n.Kill()
	}
}

// Stop closes node i gracefully; its data stays for Restart.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	if n := c.take(i); n != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			c.t.Errorf("close node %s: %v", n.ID(), err)
		}
	}
}

func (c *Cluster) take(i int) *server.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	c.nodes[i] = nil
	return n
}

// Restart starts stopped node i again with its data dir (or injected
// stores) and addresses. A node whose stores are empty (ephemeral) joins
// through the running nodes.
func (c *Cluster) Restart(i int) *server.Node {
	c.t.Helper()
	if c.Node(i) != nil {
		c.t.Fatalf("restart node %d: still running", i)
	}
	return c.startNode(i, c.APIAddrs())
}

// AddNode starts a new node that joins the running ones and returns its
// index.
func (c *Cluster) AddNode() int {
	c.t.Helper()
	i := c.Size()
	c.startNode(i, c.APIAddrs())
	return i
}

// CertDir is the directory of the cluster's certificates (WithTLS), or "".
func (c *Cluster) CertDir() string { return c.certDir }

// CA is the cluster's CA (WithTLS), for tests that issue certificates.
func (c *Cluster) CA() *pki.Pair { return c.ca }

// NodeTLS issues (once) and loads the node certificate named id, valid
// for 127.0.0.1 and localhost. The source reloads when the files change
// (polled every 100 ms), so a test rotates certificates by rewriting them.
func (c *Cluster) NodeTLS(id string) *tlsconf.Source {
	c.t.Helper()
	if _, err := os.Stat(pki.CertFile(c.certDir, id)); err != nil {
		p, err := c.ca.Issue(pki.Request{Name: id, Role: pki.RoleNode, Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			c.t.Fatalf("issue node certificate: %v", err)
		}
		if err := p.Write(c.certDir, id); err != nil {
			c.t.Fatalf("write node certificate: %v", err)
		}
	}
	src, err := tlsconf.Load(c.CertFiles(id), Logger())
	if err != nil {
		c.t.Fatalf("load node certificate: %v", err)
	}
	go src.Watch(c.tlsCtx, 100*time.Millisecond)
	return src
}

// ClientTLS loads the certificate name of CertDir ("admin" is always
// there) for a client, reloading it when the files change.
func (c *Cluster) ClientTLS(name string) *tlsconf.Source {
	c.t.Helper()
	src, err := tlsconf.Load(c.CertFiles(name), Logger())
	if err != nil {
		c.t.Fatalf("load certificate %s: %v", name, err)
	}
	go src.Watch(c.tlsCtx, 100*time.Millisecond)
	return src
}

// CertFiles names the CA and the certificate name in CertDir.
func (c *Cluster) CertFiles(name string) tlsconf.Files {
	return tlsconf.Files{CA: filepath.Join(c.certDir, pki.CAFile),
		Cert: pki.CertFile(c.certDir, name), Key: pki.KeyFile(c.certDir, name)}
}

// Client returns a raw gRPC client of the node at addr (connections are
// cached and closed at cleanup).
func (c *Cluster) Client(addr string) pb.MemFSClient {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, ok := c.conns[addr]
	if !ok {
		var err error
		creds := insecure.NewCredentials()
		if c.certDir != "" {
			creds = credentials.NewTLS(c.ClientTLS("admin").ClientConfig())
		}
		conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			c.t.Fatalf("dial %s: %v", addr, err)
		}
		c.conns[addr] = conn
	}
	return pb.NewMemFSClient(conn)
}

// ClosedWithin reports whether the peer closes conn within d: a read ends
// in EOF or a reset rather than at the deadline. Tests of connections a
// node must drop use it.
func ClosedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	if err == nil {
		return true // EOF
	}
	ne, ok := err.(net.Error)
	return !ok || !ne.Timeout()
}

// Shutdown stops every node (crash-like: fast, and graceful stops are
// tested on their own) and closes the clients; t.Cleanup calls it.
func (c *Cluster) Shutdown() {
	if c.stopTLS != nil {
		c.stopTLS()
	}
	c.mu.Lock()
	nodes := append([]*server.Node(nil), c.nodes...)
	for i := range c.nodes {
		c.nodes[i] = nil
	}
	conns := c.conns
	c.conns = map[string]*grpc.ClientConn{}
	c.mu.Unlock()
	for _, conn := range conns {
		_ = conn.Close()
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(n.Kill)
		}
	}
	wg.Wait()
}
