package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memoryfs/memfs/internal/tlsconf"
)

// Log store names accepted in Config.LogStore.
const (
	LogStoreBolt = "bolt" // raft-boltdb/v2, fsynced, behind a log cache (default)
	LogStoreWAL  = "wal"  // hashicorp/raft-wal, fsynced
	LogStoreMem  = "mem"  // in memory: survives only the loss of a minority
)

// Size limits of the command path.
const (
	// MaxWriteBytes is the largest write one Write stream may carry.
	MaxWriteBytes = 64 << 20
	// MaxReadBytes is the most one Read stream returns; a longer read is
	// cut short (eof false) and the client continues at the new offset.
	MaxReadBytes = 64 << 20
	// snapshotTimeoutScale: see openTransport.
	snapshotTimeoutScale = 32 << 10
	// maxRecvMsg bounds every incoming gRPC message: one data frame plus
	// room for the command around it. Larger messages are refused by gRPC
	// before they are buffered.
	maxRecvMsg = 1<<20 + 64<<10
)

// Config describes one node. Zero values take the defaults documented on
// each field.
type Config struct {
	// ID names the node in the Raft configuration; unique for all time.
	ID string
	// DataDir holds the log store and the snapshots. Unused with Ephemeral
	// or when Stores provides every store.
	DataDir string
	// RaftAddr is the TCP address the Raft transport binds; port 0 picks
	// one. Ignored when Transport is set.
	RaftAddr string
	// RaftAdvertise is the Raft address other nodes dial, when it differs
	// from RaftAddr (binding 0.0.0.0 in a container).
	RaftAdvertise string
	// APIAddr is the TCP address the gRPC service binds; port 0 picks one
	// (Node.APIAddr reports it).
	APIAddr string
	// APIAdvertise is the API address given to other nodes and clients,
	// when it differs from the bound one.
	APIAdvertise string
	// UnixSocket, when set, serves the same gRPC service on this path.
	UnixSocket string

	// Bootstrap creates a one-node cluster when the stores hold no state.
	Bootstrap bool
	// Join lists API addresses of members to ask for admission when the
	// stores hold no state. New retries with backoff until its ctx ends.
	Join []string
	// NonVoter joins as a non-voting member.
	NonVoter bool

	// Ephemeral keeps the log, stable and snapshot stores in memory.
	Ephemeral bool
	// LogStore is LogStoreBolt (default), LogStoreWAL or LogStoreMem.
	LogStore string
	// Stores, when set, replaces the stores New would open. A test that
	// crashes and restarts a node in-process passes the same Stores again.
	// The node never closes stores it did not open.
	Stores *Stores
	// Transport, when set, replaces the TCP transport; its LocalAddr is the
	// node's Raft address. The node does not close it, but raft's Shutdown
	// closes a transport that implements raft.WithClose (InmemTransport
	// does), so a restarted node needs a new one with the same address.
	Transport raft.Transport

	// MemoryLimit caps stored block bytes (ENOSPC past it); 0 = no limit.
	// The leader stamps its own on every log entry and all replicas
	// enforce that one, so give every node the same limit.
	MemoryLimit uint64
	// ProcessMemoryLimit caps the whole process's memory (0 = none): the
	// node measures what is not blocks and lowers the block budget it
	// stamps as leader (never above MemoryLimit, when set) so that writes
	// get ENOSPC while the process is still under this limit, and gives
	// the Go runtime the rest as its soft limit. One per process: nodes
	// sharing a process (tests) would count each other.
	ProcessMemoryLimit uint64
	// ChunkSize is the block size of a new cluster (fsm default when 0).
	ChunkSize int
	// DisableWireDedup makes the leader put every write's data in the log
	// even when its chunks are already stored (see docs/dedup.md); for
	// measuring what dedup on the wire saves.
	DisableWireDedup bool
	// DisableReadLease makes every linearizable read on the leader wait for
	// a VerifyLeader round instead of answering under the read lease
	// (docs/protocol.md, "Reads and consistency"). Set it alike on all nodes.
	DisableReadLease bool

	// Raft tunes replication; zero fields take DefaultRaftTuning's values.
	Raft RaftTuning

	// TLS, when set, serves the API and the Raft transport over TLS 1.3
	// with its certificate, and dials other nodes with it: Raft accepts
	// only node certificates of its CA, the API any certificate of its CA
	// or none (a client then needs a token). Reloading the Source rotates
	// the certificate on the next handshake. Nil serves plaintext.
	TLS *tlsconf.Source

	// Limits bound what one client may hold; zero fields take
	// DefaultLimits' values (docs/security.md, "Limits").
	Limits Limits

	// PeerDialer, when set, makes the node's connections to other nodes'
	// APIs (forwarding to the leader, status fan-out, block sync); plain
	// TCP when nil. Tests put fault injection here.
	PeerDialer func(ctx context.Context, addr string) (net.Conn, error)

	// SyncPriority orders the blocks a restore fetches from peers
	// (SmallFilesFirst when nil).
	SyncPriority BlockPriority

	// Clock stamps entries on the leader; time.Now when nil.
	Clock func() time.Time
	// TickInterval is how often a leader with open sessions appends a
	// TickCmd so leases expire on log time (1s when 0).
	TickInterval time.Duration

	// Logger receives the node's logs; slog.Default() when nil.
	Logger *slog.Logger
	// RaftLogLevel filters hashicorp/raft's own logs ("warn" when empty;
	// "off", "error", "info", "debug", "trace").
	RaftLogLevel string
	// Registerer, when set, receives the node's Prometheus metrics.
	Registerer prometheus.Registerer
}

// Limits bound the connections and calls a node accepts. A client past
// one is refused (the connection closed, or the call ResourceExhausted);
// the node and its other clients go on.
type Limits struct {
	// MaxConns caps the open API connections; MaxConnsPerHost those from
	// one remote address. Past them a new connection is closed at once.
	MaxConns, MaxConnsPerHost int
	// MaxRaftConns and MaxRaftConnsPerHost do the same on the Raft port,
	// where only the other nodes belong.
	MaxRaftConns, MaxRaftConnsPerHost int
	// NewConnsPerHost caps the new connections a second from one remote
	// address on each port (API and Raft), with a burst of as many; past
	// it a new connection is closed at once, before its TLS handshake.
	// Negative: no bound.
	NewConnsPerHost int
	// MaxStreams caps the concurrent calls on one API connection.
	MaxStreams uint32
	// HandshakeTimeout bounds a new connection's TLS handshake (API and
	// Raft) and gRPC's connection preface: a peer that connects and says
	// nothing, or dribbles, is dropped after it.
	HandshakeTimeout time.Duration
}

// DefaultLimits returns the defaults.
func DefaultLimits() Limits {
	return Limits{
		MaxConns: 16384, MaxConnsPerHost: 4096,
		MaxRaftConns: 512, MaxRaftConnsPerHost: 64, NewConnsPerHost: 64,
		MaxStreams: 1024, HandshakeTimeout: 10 * time.Second,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	orDefault(&l.MaxConns, d.MaxConns)
	orDefault(&l.MaxConnsPerHost, d.MaxConnsPerHost)
	orDefault(&l.MaxRaftConns, d.MaxRaftConns)
	orDefault(&l.MaxRaftConnsPerHost, d.MaxRaftConnsPerHost)
	orDefault(&l.NewConnsPerHost, d.NewConnsPerHost)
	orDefault(&l.MaxStreams, d.MaxStreams)
	orDefault(&l.HandshakeTimeout, d.HandshakeTimeout)
	return l
}

// orDefault sets a zero *v to def.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Stores are the three stores Raft persists to.
type Stores struct {
	Log       raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore
}

// RaftTuning holds the replication settings. docs/operations.md explains
// the defaults ("Raft settings").
type RaftTuning struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// MaxAppendEntries caps the entries per AppendEntries RPC and per log
	// store write on the leader (group commit of concurrent applies).
	MaxAppendEntries int
	// SnapshotThreshold entries since the last snapshot trigger one;
	// TrailingLogs entries stay behind it. Threshold > TrailingLogs, or the
	// log is never truncated.
	SnapshotThreshold uint64
	TrailingLogs      uint64
	SnapshotInterval  time.Duration
	// MaxLogBytes bounds the log in bytes: past it the node takes a
	// snapshot and keeps behind it only the newest entries that fit in
	// half of it (server/logbytes.go).
	MaxLogBytes uint64
	// SnapshotRetain is how many snapshot files stay on disk.
	SnapshotRetain int

	// MaxInflightApplies bounds the batched entries the leader has handed
	// to Raft and not yet committed. The batcher also holds a new entry
	// back until the leader has written the previous one, so commands
	// that arrive meanwhile form one batch (docs/operations.md).
	MaxInflightApplies int
	// MaxBatchCommands and MaxBatchBytes cap one batched entry.
	MaxBatchCommands int
	MaxBatchBytes    int
	// An entry of at least LargeEntryBytes (a big write) takes one of
	// MaxInflightLargeApplies slots instead: its cost is its bytes, which
	// batching cannot share, and the log stores write many of them in one
	// go only if many are queued (docs/operations.md).
	MaxInflightLargeApplies int
	LargeEntryBytes         int

	// MaxRPCsInFlight pipelines AppendEntries to each follower when 2 or
	// more. The default, 1, turns pipelining off: hashicorp/raft v1.8.0's
	// pipeline can deadlock (docs/operations.md, "Raft settings").
	MaxRPCsInFlight int
	// TransportTimeout is the I/O deadline of a Raft RPC.
	TransportTimeout time.Duration
	// TransportPool is the connections kept per peer.
	TransportPool int
	// LogCacheSize is the entries kept in memory in front of the log store,
	// LogCacheBytes the most bytes of entry data they may hold while
	// writes flow, and LogCacheIdleBytes the most once less than that
	// arrived in two seconds (see logCache).
	LogCacheSize      int
	LogCacheBytes     int
	LogCacheIdleBytes int
}

// DefaultRaftTuning returns the LAN defaults.
func DefaultRaftTuning() RaftTuning {
	return RaftTuning{
		HeartbeatTimeout:        400 * time.Millisecond,
		ElectionTimeout:         400 * time.Millisecond,
		LeaderLeaseTimeout:      400 * time.Millisecond,
		CommitTimeout:           20 * time.Millisecond,
		MaxAppendEntries:        64,
		SnapshotThreshold:       2048,
		TrailingLogs:            512,
		SnapshotInterval:        20 * time.Second,
		MaxLogBytes:             256 << 20,
		SnapshotRetain:          2,
		MaxInflightApplies:      4,
		MaxBatchCommands:        256,
		MaxBatchBytes:           4 << 20,
		MaxInflightLargeApplies: 16,
		LargeEntryBytes:         256 << 10,
		MaxRPCsInFlight:         1,
		TransportTimeout:        10 * time.Second,
		TransportPool:           3,
		LogCacheSize:            64,
		LogCacheBytes:           64 << 20,
		LogCacheIdleBytes:       4 << 20,
	}
}

// withDefaults fills zero fields from DefaultRaftTuning.
func (t RaftTuning) withDefaults() RaftTuning {
	d := DefaultRaftTuning()
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setU64 := func(v *uint64, def uint64) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&t.HeartbeatTimeout, d.HeartbeatTimeout)
	setDur(&t.ElectionTimeout, d.ElectionTimeout)
	setDur(&t.LeaderLeaseTimeout, d.LeaderLeaseTimeout)
	setDur(&t.CommitTimeout, d.CommitTimeout)
	setInt(&t.MaxAppendEntries, d.MaxAppendEntries)
	setU64(&t.SnapshotThreshold, d.SnapshotThreshold)
	setU64(&t.TrailingLogs, d.TrailingLogs)
	setDur(&t.SnapshotInterval, d.SnapshotInterval)
	setU64(&t.MaxLogBytes, d.MaxLogBytes)
	setInt(&t.SnapshotRetain, d.SnapshotRetain)
	setInt(&t.MaxInflightApplies, d.MaxInflightApplies)
	setInt(&t.MaxBatchCommands, d.MaxBatchCommands)
	setInt(&t.MaxBatchBytes, d.MaxBatchBytes)
	setInt(&t.MaxInflightLargeApplies, d.MaxInflightLargeApplies)
	setInt(&t.LargeEntryBytes, d.LargeEntryBytes)
	setInt(&t.MaxRPCsInFlight, d.MaxRPCsInFlight)
	setDur(&t.TransportTimeout, d.TransportTimeout)
	setInt(&t.TransportPool, d.TransportPool)
	setInt(&t.LogCacheSize, d.LogCacheSize)
	setInt(&t.LogCacheBytes, d.LogCacheBytes)
	setInt(&t.LogCacheIdleBytes, d.LogCacheIdleBytes)
	return t
}

// raftConfig turns the tuning into hashicorp/raft's Config.
func (t RaftTuning) raftConfig(id string) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(id)
	c.HeartbeatTimeout = t.HeartbeatTimeout
	c.ElectionTimeout = t.ElectionTimeout
	c.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	c.CommitTimeout = t.CommitTimeout
	c.MaxAppendEntries = t.MaxAppendEntries
	c.BatchApplyCh = true
	c.SnapshotThreshold = t.SnapshotThreshold
	c.TrailingLogs = t.TrailingLogs
	c.SnapshotInterval = t.SnapshotInterval
	c.ShutdownOnRemove = true
	c.NoLegacyTelemetry = true
	return c
}

// check reports settings that cannot work together.
func (c *Config) check() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("node id is empty"))
	}
	if c.Bootstrap && len(c.Join) > 0 {
		errs = append(errs, errors.New("bootstrap and join exclude each other"))
	}
	if err := checkProcessLimit(c.ProcessMemoryLimit); err != nil {
		errs = append(errs, err)
	}
	switch c.LogStore {
	case "", LogStoreBolt, LogStoreWAL, LogStoreMem:
	default:
		errs = append(errs, fmt.Errorf("unknown log store %q (want bolt, wal or mem)", c.LogStore))
	}
	needDir := !c.Ephemeral && (c.Stores == nil || c.Stores.Snapshots == nil)
	if needDir && c.DataDir == "" {
		errs = append(errs, errors.New("data dir is empty (or use ephemeral)"))
	}
	if c.Transport == nil && c.RaftAddr == "" {
		errs = append(errs, errors.New("raft address is empty"))
	}
	if c.APIAddr == "" {
		errs = append(errs, errors.New("api address is empty"))
	}
	t := c.Raft
	if t.SnapshotThreshold <= t.TrailingLogs {
		errs = append(errs, fmt.Errorf("snapshot threshold %d must exceed trailing logs %d, or the log is never truncated",
			t.SnapshotThreshold, t.TrailingLogs))
	}
	if t.LeaderLeaseTimeout > t.HeartbeatTimeout {
		errs = append(errs, errors.New("leader lease timeout must not exceed the heartbeat timeout"))
	}
	if t.MaxInflightApplies < 0 || t.MaxInflightLargeApplies < 0 {
		errs = append(errs, errors.New("in-flight applies must not be negative"))
	}
	return errors.Join(errs...)
}
