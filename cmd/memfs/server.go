package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/internal/heapgoal"
	"github.com/memoryfs/memfs/internal/hostmem"
	"github.com/memoryfs/memfs/internal/hugepages"
	"github.com/memoryfs/memfs/internal/tlsconf"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/opsweb"
)

type serverOptions struct {
	id, data, raftAddr, apiAddr, raftAdvertise, apiAdvertise, unix string
	bootstrap, ephemeral, nonvoter, wireDedup, hugePages           bool
	join                                                           []string
	logStore, memoryLimit, chunkSize, metricsAddr, gcHeadroom      string
	logLevel, logFormat, raftLogLevel                              string
	tuning                                                         server.RaftTuning
	readLease, insecure                                            bool
	tlsPoll                                                        time.Duration
	limits                                                         server.Limits
}

func newServerCmd() *cobra.Command {
	o := &serverOptions{}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run one MemoryFS node",
		Long: `Run one MemoryFS node until SIGINT or SIGTERM, which stop it gracefully
(a leader hands leadership over first).

A new cluster starts with one node run with --bootstrap; the others are run
with --join naming members' API addresses. A node restarted on its data dir
comes back with its state and needs neither flag. A new node run with
neither flag waits until the cluster adds it (memfs node replace).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runServer(cmd, args, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.id, "id", "", "node id, unique in the cluster for all time (required)")
	f.StringVar(&o.data, "data", "", "data directory for the Raft log and snapshots (required unless --ephemeral)")
	f.StringVar(&o.raftAddr, "raft-addr", "127.0.0.1:7101", "address for Raft traffic between nodes")
	f.StringVar(&o.apiAddr, "api-addr", "127.0.0.1:7001", "address of the gRPC API for clients and nodes")
	f.StringVar(&o.raftAdvertise, "raft-advertise", "", "Raft address other nodes dial, if not --raft-addr")
	f.StringVar(&o.apiAdvertise, "api-advertise", "", "API address given to others, if not --api-addr")
	f.StringVar(&o.unix, "unix", "", "also serve the API on this Unix socket")
	f.BoolVar(&o.bootstrap, "bootstrap", false, "create a new cluster with this node (only if the data dir is empty)")
	f.StringSliceVar(&o.join, "join", nil, "API addresses of members to ask for admission (comma-separated)")
	f.BoolVar(&o.nonvoter, "nonvoter", false, "join as a non-voting member")
	f.BoolVar(&o.ephemeral, "ephemeral", false, "keep the Raft log and snapshots in memory (survives only minority loss)")
	f.StringVar(&o.logStore, "log-store", server.LogStoreBolt, "Raft log store: bolt, wal or mem")
	f.BoolVar(&o.hugePages, "huge-pages", true, hugePagesUsage)
	f.StringVar(&o.memoryLimit, "memory-limit", "", "cap on the whole process's memory, file data included; writes get ENOSPC before it, e.g. 1GiB or 4GiB (default: a quarter of RAM or of the memory cgroup's limit)")
	f.StringVar(&o.gcHeadroom, "gc-headroom", "256MiB", "heap the Go GC may add past live data before collecting, instead of GOGC's 100% of it; 0 keeps GOGC (docs/operations.md)")
	f.StringVar(&o.chunkSize, "chunk-size", "", "block size of a new cluster, e.g. 64KiB (default: the state machine's)")
	f.BoolVar(&o.wireDedup, "wire-dedup", true, "as leader, send a write's already stored chunks by hash instead of data (docs/dedup.md)")
	f.BoolVar(&o.readLease, "read-lease", true, "as leader, answer linearizable reads under a lease instead of a heartbeat round each; set alike on all nodes (docs/protocol.md)")
	f.BoolVar(&o.insecure, "insecure", false, "serve the API and Raft in plaintext without authentication (a warning is logged at every start); without it --ca, --cert and --key are required")
	f.DurationVar(&o.tlsPoll, "tls-reload-interval", 5*time.Second, "how often to look for changed --ca/--cert/--key files (SIGHUP reloads them at once)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics, /livez, /readyz, the status page at / and Go profiles at /debug/pprof/")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&o.raftLogLevel, "raft-log-level", "warn", "level of hashicorp/raft's own logs: trace, debug, info, warn, error, off")
	dl, l := server.DefaultLimits(), &o.limits
	f.IntVar(&l.MaxConns, "max-conns", dl.MaxConns, "open API connections; more are closed at once")
	f.IntVar(&l.MaxConnsPerHost, "max-conns-per-host", dl.MaxConnsPerHost, "open API connections from one remote address")
	f.IntVar(&l.MaxRaftConns, "max-raft-conns", dl.MaxRaftConns, "open Raft connections")
	f.IntVar(&l.MaxRaftConnsPerHost, "max-raft-conns-per-host", dl.MaxRaftConnsPerHost, "open Raft connections from one remote address")
	f.IntVar(&l.NewConnsPerHost, "new-conns-per-host", dl.NewConnsPerHost, "new connections a second from one remote address, on each port (negative: no bound)")
	f.Uint32Var(&l.MaxStreams, "max-streams", dl.MaxStreams, "concurrent calls on one API connection")
	f.DurationVar(&l.HandshakeTimeout, "handshake-timeout", dl.HandshakeTimeout, "time a new connection has for its TLS handshake and gRPC preface")
	d := server.DefaultRaftTuning()
	t := &o.tuning
	f.DurationVar(&t.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "Raft follower timeout before an election")
	f.DurationVar(&t.ElectionTimeout, "election-timeout", d.ElectionTimeout, "Raft candidate timeout")
	f.DurationVar(&t.LeaderLeaseTimeout, "leader-lease-timeout", d.LeaderLeaseTimeout, "Raft leader lease (<= heartbeat timeout)")
	f.Uint64Var(&t.SnapshotThreshold, "snapshot-threshold", d.SnapshotThreshold, "log entries between snapshots")
	f.Uint64Var(&t.TrailingLogs, "trailing-logs", d.TrailingLogs, "log entries kept behind a snapshot (< snapshot threshold)")
	f.DurationVar(&t.SnapshotInterval, "snapshot-interval", d.SnapshotInterval, "how often to check the snapshot threshold")
	f.Uint64Var(&t.MaxLogBytes, "max-log-bytes", d.MaxLogBytes, "bytes of log entries that trigger a snapshot (half of it stays behind the snapshot)")
	f.IntVar(&t.MaxInflightApplies, "max-inflight-applies", d.MaxInflightApplies, "batched log entries the leader keeps in flight")
	f.IntVar(&t.MaxInflightLargeApplies, "max-inflight-large-applies", d.MaxInflightLargeApplies, "large log entries (big writes) the leader keeps in flight")
	f.IntVar(&t.MaxAppendEntries, "max-append-entries", d.MaxAppendEntries, "log entries per AppendEntries RPC and per leader disk write")
	f.IntVar(&t.MaxRPCsInFlight, "max-rpcs-in-flight", d.MaxRPCsInFlight, "AppendEntries in flight per follower; 2 or more pipelines them (hashicorp/raft's pipeline can deadlock: docs/operations.md)")
	return cmd
}

func runServer(cmd *cobra.Command, _ []string, o *serverOptions) error {
	if o.id == "" {
		return usageError{errors.New("--id is required")}
	}
	if o.data == "" && !o.ephemeral {
		return usageError{errors.New("--data is required (or --ephemeral)")}
	}
	logger, err := newLogger(o.logLevel, o.logFormat)
	if err != nil {
		return usageError{err}
	}
	limit, err := memoryLimit(o.memoryLimit)
	if err != nil {
		return usageError{fmt.Errorf("--memory-limit: %w", err)}
	}
	headroom, err := parseSize(o.gcHeadroom)
	if err != nil {
		return usageError{fmt.Errorf("--gc-headroom: %w", err)}
	}
	if o.hugePages {
		// Without a headroom (GOGC=100) the heap reaches twice the data it holds.
		reserveHugePages(logger, 2*limit)
	}
	defer heapgoal.Start(headroom, heapgoal.DefaultMax, logger).Stop()
	var chunk uint64
	if o.chunkSize != "" {
		if chunk, err = parseSize(o.chunkSize); err != nil {
			return usageError{fmt.Errorf("--chunk-size: %w", err)}
		}
	}
	sec, err := serverTLS(logger, o.insecure)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := server.Config{
		ID: o.id, DataDir: o.data, RaftAddr: o.raftAddr, APIAddr: o.apiAddr,
		RaftAdvertise: o.raftAdvertise, APIAdvertise: o.apiAdvertise, UnixSocket: o.unix,
		Bootstrap: o.bootstrap, Join: o.join, NonVoter: o.nonvoter,
		Ephemeral: o.ephemeral, LogStore: o.logStore,
		MemoryLimit: limit, ProcessMemoryLimit: limit, ChunkSize: int(chunk), DisableWireDedup: !o.wireDedup, Raft: o.tuning,
		DisableReadLease: !o.readLease, Logger: logger, RaftLogLevel: o.raftLogLevel, Registerer: reg,
		TLS: sec, Limits: o.limits,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if sec != nil {
		go reloadTLS(ctx, sec, o.tlsPoll)
	}
	// The operator endpoints answer from the start (a joining node may
	// wait long in server.New); until the node exists it is not ready and
	// has no page.
	var running atomic.Pointer[server.Node]
	var page atomic.Pointer[opsweb.Page]
	if o.metricsAddr != "" {
		ready := func() error {
			if n := running.Load(); n != nil {
				return n.Ready()
			}
			return fmt.Errorf("%w: starting", server.ErrNotReady)
		}
		pageOrWait := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if p := page.Load(); p != nil {
				p.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, "the node is starting; this page will be here once it runs", http.StatusServiceUnavailable)
		})
		h := opsweb.Handler(opsweb.Options{Registry: reg, Ready: ready, Page: pageOrWait})
		if _, err := opsweb.Serve(ctx, o.metricsAddr, h, logger); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	waiting := false
	if !o.bootstrap && len(o.join) == 0 {
		has := false
		if !o.ephemeral {
			if has, err = server.HasState(o.data); err != nil {
				return fmt.Errorf("inspect %s: %w", o.data, err)
			}
		}
		waiting = !has
	}
	node, err := server.New(ctx, cfg)
	if err != nil {
		return err
	}
	running.Store(node)
	if o.metricsAddr != "" {
		page.Store(opsweb.NewPage(ctx, node, logger))
	}
	if waiting {
		// A node without state and without --join is a spare: the cluster
		// adds it (memfs node replace), and Raft then sends it everything.
		logger.Info("no state, and neither --bootstrap nor --join: waiting to be added by the cluster",
			"hint", fmt.Sprintf("memfs node replace OLD --with %s@%s,%s", o.id, node.RaftAddr(), node.APIAddr()))
	}
	logger.Info("serving", "id", o.id, "api_addr", node.APIAddr(), "raft_addr", node.RaftAddr(),
		"memory_limit", limit)
	<-ctx.Done()
	logger.Info("signal received; stopping")
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return node.Close(cctx)
}

// serverTLS loads the node's certificate, or returns nil with --insecure
// after logging the warning an operator must see on every start.
func serverTLS(log *slog.Logger, insecure bool) (*tlsconf.Source, error) {
	files, err := tlsFiles()
	if err != nil {
		return nil, err
	}
	if insecure {
		if files.CA != "" {
			log.Warn("--insecure: ignoring --ca, --cert and --key (or MEMFS_CA, MEMFS_CERT, MEMFS_KEY)")
		}
		log.Warn("INSECURE: the API and Raft are served in plaintext and anyone who reaches the ports can read, change or delete every file and change the membership; run with --ca, --cert and --key (docs/security.md)")
		return nil, nil
	}
	if files.CA == "" || files.Cert == "" {
		return nil, usageError{errors.New("TLS is required: give --ca, --cert and --key (make them with `memfs cert`), or run with --insecure")}
	}
	src, err := tlsconf.Load(files, log)
	if err != nil {
		return nil, explainedError{fmt.Errorf("TLS files: %w", err)}
	}
	if leaf := src.Certificate(); !tlsconf.HasRole(leaf, tlsconf.NodeRole) {
		return nil, explainedError{fmt.Errorf("%s is not a node certificate (its organizational unit is %q, want %q)",
			files.Cert, leaf.Subject.OrganizationalUnit, tlsconf.NodeRole)}
	}
	return src, nil
}

// reloadTLS reloads the certificate files on SIGHUP and when they change.
func reloadTLS(ctx context.Context, src *tlsconf.Source, poll time.Duration) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go src.Watch(ctx, poll)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_ = src.Reload() // logs its outcome
		}
	}
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

const hugePagesUsage = `let the heap grow into transparent huge pages where the system setting is "madvise" (address space, not memory, is reserved)`

// reserveHugePages lets a heap expected to reach want bytes grow into
// huge pages, and logs what it did or why not.
func reserveHugePages(log *slog.Logger, want uint64) {
	sys, err := hugepages.ReadSystem()
	if err != nil {
		log.Info("no huge pages", "err", err)
		return
	}
	size, why := hugepages.Plan(sys, want)
	if size == 0 {
		log.Info("no huge pages reserved", "thp", sys.Mode, "reason", why)
		return
	}
	advised, err := hugepages.Reserve(size)
	if err != nil {
		log.Warn("huge page advice failed", "err", err)
	}
	log.Info("huge pages reserved", "thp", sys.Mode, "bytes", size, "advised", advised)
}

// memoryLimit parses --memory-limit, the whole process's limit: empty
// means a quarter of what the host can back (its RAM, or a memory cgroup's
// limit). A limit the host cannot back is refused: the kernel would kill
// the node before it ever answered ENOSPC.
func memoryLimit(s string) (uint64, error) {
	host, err := hostmem.Read()
	if s == "" {
		if err != nil {
			return 1 << 30, nil // cannot tell: a modest budget
		}
		return max(host.Bytes/4, server.MinProcessMemoryLimit), nil
	}
	limit, perr := parseSize(s)
	if perr != nil {
		return 0, perr
	}
	if err == nil && limit > host.Bytes {
		return 0, fmt.Errorf("%s is more than this host can back: %s (%s)", s, humanBytes(host.Bytes), host.Source)
	}
	if limit < server.MinProcessMemoryLimit {
		return 0, fmt.Errorf("%s is less than the %s a node needs for itself", s, humanBytes(server.MinProcessMemoryLimit))
	}
	return limit, nil
}

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// parseSize reads a byte count such as 4096, 64KiB, 512MiB, 4GiB or 1.5G
// (single letters are binary units).
func parseSize(s string) (uint64, error) {
	in := strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(strings.ToUpper(in), strings.ToUpper(u.suffix)) {
			in, mult = strings.TrimSpace(in[:len(in)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(in, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size (try 4096, 64KiB, 512MiB or 4GiB)", s)
	}
	n := v * float64(mult)
	if n >= 1<<63 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(n), nil
}
