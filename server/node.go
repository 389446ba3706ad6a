package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/internal/grpcopts"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/blockdir"
)

// Node is one running MemoryFS server.
type Node struct {
	cfg      Config
	log      *slog.Logger
	hlog     hclog.Logger
	raftAddr string
	apiAddr  string

	fsm      fsm.Applier
	rfsm     *raftFSM
	raft     *raft.Raft
	stores   *openedStores
	held     *heldLog // sizes of the log entries held (logbytes.go)
	trans    raft.Transport
	ownTrans *raft.NetworkTransport // closed on stop; nil when injected

	grpc     *grpc.Server
	apiLis   net.Listener
	unixLis  net.Listener
	batcher  *batcher
	memory   *memGovernor // nil without a process memory limit
	verifier *verifier
	lease    *readLease // see readindex.go
	ready    *leaderReady
	peers    *peers
	watchers *watchers
	gate     *voteGate // wraps the Raft transport (see votegate.go)
	sync     *blockSync
	metrics  *metrics
	traffic  traffic

	ctx    context.Context // ends when the node stops
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   sync.Once
}

// New starts a node: it opens the stores, starts Raft and the gRPC service,
// bootstraps or joins when the stores are empty, and returns. With Join it
// returns once a member has admitted it, retrying until ctx ends.
func New(ctx context.Context, cfg Config) (*Node, error) {
	cfg.Raft = cfg.Raft.withDefaults()
	cfg.Limits = cfg.Limits.withDefaults()
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = time.Second
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), ready: newLeaderReady(), peers: newPeers(cfg.PeerDialer, cfg.TLS),
		watchers: newWatchers()}
	n.hlog = raftLogger(n.log, cfg.RaftLogLevel)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if err := n.start(ctx); err != nil {
		n.teardown(false)
		return nil, err
	}
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	f, err := fsm.New(fsm.Config{ChunkSize: n.cfg.ChunkSize, MemoryLimit: n.cfg.MemoryLimit, OnChange: n.watchers.publish})
	if err != nil {
		return fmt.Errorf("state machine: %w", err)
	}
	n.fsm = f
	n.metrics = newMetrics(n.cfg.ID, f.Stats, n.AppliedIndex, &n.traffic)
	n.rfsm = newRaftFSM(f, n.log, n.metrics)
	// Registered once rfsm exists: a scrape may come at once.
	if err := n.metrics.register(n.cfg.Registerer); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	if err := n.openBlockSync(); err != nil {
		return err
	}
	if err := n.listen(); err != nil {
		return err
	}
	if n.stores, err = openStores(&n.cfg, n.hlog); err != nil {
		return err
	}
	if n.sync.dir != nil {
		n.rfsm.snaps = newBlockSnapshots(n.stores.Snapshots, n.sync)
		n.stores.Snapshots = n.rfsm.snaps
	}
	watch := newStoreWatch()
	n.held = newHeldLog(n.cfg.Raft.MaxLogBytes)
	n.stores.Log = countingLogStore{LogStore: n.stores.Log, n: &n.traffic.logBytes, watch: watch, held: n.held}
	if err := n.openTransport(); err != nil {
		return err
	}
	hasState, err := raft.HasExistingState(n.stores.Log, n.stores.Stable, n.stores.Snapshots)
	if err != nil {
		return fmt.Errorf("inspect raft state: %w", err)
	}
	// An ephemeral node that starts empty and joins may be an old member
	// back with amnesia: it stays out of elections until caught up.
	n.gate = newVoteGate(n.trans, n.cfg.ID, n.cfg.Ephemeral && !hasState && len(n.cfg.Join) > 0)
	n.lease = newReadLease(n.cfg, hasState)
	n.trans = n.lease.transport(n.gate) // wraps the gate: see readindex.go
	if err := n.startRaft(hasState); err != nil {
		return err
	}
	n.batcher = newBatcher(n.raft, n.cfg.Clock, n.cfg.Raft, n.metrics, n.cfg.MemoryLimit, watch)
	if n.cfg.ProcessMemoryLimit > 0 {
		blockLimit := n.cfg.MemoryLimit
		if blockLimit == 0 {
			blockLimit = fsm.NoMemoryLimit
		}
		n.memory = newMemGovernor(n.cfg.ProcessMemoryLimit,
			func() uint64 { return n.fsm.Stats().Block.PhysicalBytes },
			func(budget uint64) { n.batcher.memoryLimit.Store(min(budget, blockLimit)) })
		n.goBackground(func() { n.memory.run(n.ctx) })
	}
	n.verifier = &verifier{raft: n.raft}
	n.lease.attach(liveRaft{n.raft})
	n.serve()
	n.goBackground(n.leaderLoop)
	n.goBackground(n.tickLoop)
	n.goBackground(n.boundLogLoop)
	n.goBackground(n.selfAddressLoop)
	n.log.Info("node started", "raft_addr", n.raftAddr, "api_addr", n.apiAddr,
		"unix", n.cfg.UnixSocket, "existing_state", hasState, "log_store", n.logStoreName())
	if !hasState && len(n.cfg.Join) > 0 {
		if err := n.join(ctx); err != nil {
			return err
		}
		if g := n.gate; g.gated {
			n.goBackground(func() { n.openWhenCaughtUp(g) })
		}
	}
	return nil
}

// openBlockSync sets up block sync and, for a node with a data dir that
// is not ephemeral, the block directory its snapshots keep blocks in.
func (n *Node) openBlockSync() error {
	prio := n.cfg.SyncPriority
	if prio == nil {
		prio = SmallFilesFirst
	}
	n.sync = &blockSync{ctx: n.ctx, id: n.cfg.ID, fsm: n.fsm, peers: n.peers, priority: prio, log: n.log, giveUp: syncGiveUp, idle: syncIdle}
	if !n.cfg.Ephemeral && n.cfg.DataDir != "" {
		dir, err := blockdir.Open(filepath.Join(n.cfg.DataDir, "blocks"))
		if err != nil {
			return err
		}
		n.sync.dir = dir
	}
	n.rfsm.sync, n.rfsm.ctx = n.sync, n.ctx
	return nil
}

func (n *Node) logStoreName() string {
	switch {
	case n.cfg.Stores != nil && n.cfg.Stores.Log != nil:
		return "injected"
	case n.cfg.Ephemeral:
		return LogStoreMem
	case n.cfg.LogStore == "":
		return LogStoreBolt
	}
	return n.cfg.LogStore
}

// listen binds the API address and the Unix socket.
func (n *Node) listen() error {
	lis, err := net.Listen("tcp", n.cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("listen on api address: %w", err)
	}
	n.apiLis = newLimitListener(lis, n.cfg.Limits.MaxConns, n.cfg.Limits.MaxConnsPerHost, n.cfg.Limits.NewConnsPerHost)
	n.apiAddr = lis.Addr().String()
	if n.cfg.APIAdvertise != "" {
		n.apiAddr = n.cfg.APIAdvertise
	}
	if n.cfg.UnixSocket == "" {
		return nil
	}
	if fi, err := os.Lstat(n.cfg.UnixSocket); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(n.cfg.UnixSocket) // stale socket of an earlier run
	}
	ul, err := net.Listen("unix", n.cfg.UnixSocket)
	if err != nil {
		return fmt.Errorf("listen on unix socket: %w", err)
	}
	n.unixLis = ul
	return nil
}

func (n *Node) openTransport() error {
	if n.cfg.Transport != nil {
		n.trans = n.cfg.Transport
		n.raftAddr = string(n.trans.LocalAddr())
		return nil
	}
	var adv net.Addr
	if n.cfg.RaftAdvertise != "" {
		a, err := net.ResolveTCPAddr("tcp", n.cfg.RaftAdvertise)
		if err != nil {
			return fmt.Errorf("raft advertise address: %w", err)
		}
		adv = a
	}
	// raft's own TCP layer, with connections that count their bytes.
	counting, err := newCountingTCPStream(n.cfg.RaftAddr, adv, &n.traffic)
	if err != nil {
		return fmt.Errorf("raft transport on %s: %w", n.cfg.RaftAddr, err)
	}
	counting.lis = newLimitListener(counting.lis, n.cfg.Limits.MaxRaftConns, n.cfg.Limits.MaxRaftConnsPerHost, n.cfg.Limits.NewConnsPerHost)
	var stream raft.StreamLayer = counting
	if n.cfg.TLS != nil {
		stream = newTLSStream(counting, n.cfg.TLS, n.cfg.Limits.HandshakeTimeout, n.log)
	}
	t := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:          stream,
		Logger:          n.hlog.Named("net"),
		MaxPool:         n.cfg.Raft.TransportPool,
		MaxRPCsInFlight: n.cfg.Raft.MaxRPCsInFlight,
		Timeout:         n.cfg.Raft.TransportTimeout,
	})
	// A snapshot install's deadline is Timeout x (snapshot size / scale).
	// Our snapshots name blocks instead of holding them (~40 bytes per
	// 64 KiB block), and the receiver fetches the blocks inside that
	// deadline, so the scale is far below raft's 256 KiB: about 10 s per
	// 55 MiB of blocks named, with the default timeout.
	t.TimeoutScale = snapshotTimeoutScale
	n.ownTrans, n.trans = t, t
	n.raftAddr = string(t.LocalAddr())
	return nil
}

func (n *Node) startRaft(hasState bool) error {
	rc := n.cfg.Raft.raftConfig(n.cfg.ID)
	rc.Logger = n.hlog
	r, err := raft.NewRaft(rc, n.rfsm, n.stores.Log, n.stores.Stable, n.stores.Snapshots, n.trans)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	if hasState || !n.cfg.Bootstrap {
		return nil
	}
	boot := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter, ID: raft.ServerID(n.cfg.ID), Address: raft.ServerAddress(n.raftAddr)}}}
	if err := r.BootstrapCluster(boot).Error(); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	n.log.Info("bootstrapped a new cluster")
	return nil
}

// serve starts the gRPC service on every listener.
func (n *Node) serve() {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecvMsg),
		// Clients ping every few seconds while they wait on a stream
		// (client.keepaliveTime); the node pings idle clients so the
		// Watch streams of vanished ones end.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 2 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.MaxConcurrentStreams(n.cfg.Limits.MaxStreams),
		grpc.ConnectionTimeout(n.cfg.Limits.HandshakeTimeout),
		grpc.ChainUnaryInterceptor(n.recoverUnary, n.authUnary),
		grpc.ChainStreamInterceptor(n.recoverStream, n.authStream),
	}
	opts = append(opts, grpcopts.Server(n.cfg.TLS != nil)...)
	if n.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(tlsconf.NewCredentials(n.cfg.TLS.ServerConfig())))
	}
	n.grpc = grpc.NewServer(opts...)
	pb.RegisterMemFSServer(n.grpc, &service{n: n})
	for _, lis := range []net.Listener{n.apiLis, n.unixLis} {
		if lis == nil {
			continue
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				n.log.Error("grpc serve", "addr", lis.Addr().String(), "err", err)
			}
		}()
	}
}

func (n *Node) goBackground(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

// Close stops the node gracefully: a leader hands leadership to another
// voter first, in-flight requests finish, then Raft and the stores close.
// When ctx ends first the rest of the stop is abrupt.
func (n *Node) Close(ctx context.Context) error {
	var err error
	n.stop.Do(func() {
		if n.raft != nil && n.raft.State() == raft.Leader && n.otherVoters() > 0 {
			if e := waitFuture(ctx, n.raft.LeadershipTransfer()); e != nil {
				n.log.Warn("leadership transfer before shutdown failed", "err", e)
			}
		}
		n.cancel()
		stopped := make(chan struct{})
		go func() {
			n.grpc.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			n.grpc.Stop()
			<-stopped
		}
		err = n.teardown(true)
		n.log.Info("node stopped")
	})
	return err
}

// Kill stops the node like a crash: no leadership transfer, no waiting for
// clients, no final snapshot. Stores the node opened are closed so the
// same data dir can be opened again; injected stores keep their state.
func (n *Node) Kill() {
	n.stop.Do(func() {
		n.cancel()
		if n.grpc != nil {
			n.grpc.Stop()
		}
		_ = n.teardown(false)
		n.log.Info("node killed")
	})
}

// teardown releases everything start may have acquired, in reverse order.
func (n *Node) teardown(graceful bool) error {
	n.cancel()
	var errs []error
	if n.grpc != nil {
		n.grpc.Stop()
	} else {
		for _, l := range []net.Listener{n.apiLis, n.unixLis} {
			if l != nil {
				_ = l.Close()
			}
		}
	}
	// Raft first: its shutdown releases a batcher blocked in Apply, and
	// entries still in flight fail with ErrRaftShutdown (UNAVAILABLE).
	if n.raft != nil {
		if err := n.raft.Shutdown().Error(); err != nil && graceful {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		n.metrics.setRaftState(raft.Shutdown)
	}
	if n.batcher != nil {
		n.batcher.close()
	}
	n.wg.Wait()
	n.peers.close()
	n.watchers.closeAll()
	if n.gate != nil {
		n.gate.stopHeartbeats() // before the stores close: see votegate.go
		n.gate.halt()
	}
	if n.ownTrans != nil {
		errs = append(errs, n.ownTrans.Close())
	}
	if n.stores != nil {
		errs = append(errs, n.stores.close())
	}
	if n.sync != nil && n.sync.dir != nil {
		errs = append(errs, n.sync.dir.Close())
	}
	if n.metrics != nil {
		n.metrics.unregister(n.cfg.Registerer)
	}
	if n.unixLis != nil {
		_ = os.Remove(n.cfg.UnixSocket)
	}
	return errors.Join(errs...)
}

// waitFuture waits for f or ctx.
func waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *Node) otherVoters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.ID {
			c++
		}
	}
	return c
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.ID }

// APIAddr returns the address clients and other nodes dial.
func (n *Node) APIAddr() string { return n.apiAddr }

// RaftAddr returns the node's Raft transport address.
func (n *Node) RaftAddr() string { return n.raftAddr }

// UnixSocket returns the Unix socket path, or "".
func (n *Node) UnixSocket() string { return n.cfg.UnixSocket }

// Raft exposes the Raft instance to tests and tools. Do not call Barrier on
// it: barriers are invisible to the state machine adapter, and a
// linearizable read right after one would wait for the next entry.
func (n *Node) Raft() *raft.Raft { return n.raft }

// FSM returns the node's state machine.
func (n *Node) FSM() fsm.Applier { return n.fsm }

// State returns the node's Raft state.
func (n *Node) State() raft.RaftState { return n.raft.State() }

// IsLeader reports whether the node is the Raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// AppliedIndex is the last log index this node has applied (file system,
// metadata and configuration entries alike).
func (n *Node) AppliedIndex() uint64 { return n.rfsm.applied.Load() }

// WaitApplied returns once the node has applied every entry up to index.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	return n.rfsm.waitApplied(ctx, index)
}

// LeaderReady reports whether this node leads and has applied an entry of
// its own term, so that it may serve linearizable reads: until then its
// commit index may lag entries an earlier leader committed. Whoever waits
// for a cluster that can serve (a health probe, a test harness) polls it.
func (n *Node) LeaderReady() bool {
	return n.IsLeader() && n.ready.readyIn(n.raft.CurrentTerm())
}

// Leader returns the leader's id and API address as this node knows them
// ("" when unknown).
func (n *Node) Leader() (id, apiAddr string) {
	_, lid := n.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	if string(lid) == n.cfg.ID {
		return n.cfg.ID, n.apiAddr
	}
	return string(lid), n.rfsm.member(string(lid))
}

// Members returns the replicated map node id -> API address.
func (n *Node) Members() map[string]string { return n.rfsm.memberMap() }
