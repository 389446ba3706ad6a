package server

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// metrics are one node's Prometheus metrics, all declared here. Each node
// has its own set (several nodes may share a process in tests); a node
// label tells them apart when they share a registry.
type metrics struct {
	applyLatency  *prometheus.HistogramVec
	recallWait    prometheus.Histogram
	batchCommands prometheus.Histogram
	batchBytes    prometheus.Histogram
	commands      *prometheus.CounterVec
	queryLatency  *prometheus.HistogramVec
	forwarded     *prometheus.CounterVec
	raftState     *prometheus.GaugeVec
	undecodable   prometheus.Counter
	panics        prometheus.Counter

	collectors []prometheus.Collector
}

const (
	metricsNamespace = "memfs"
	metricsSubsystem = "server"
)

// newMetrics declares them; applied reads the node's applied index.
func newMetrics(nodeID string, stats func() fsm.Stats, applied func() uint64, tr *traffic) *metrics {
	labels := prometheus.Labels{"node": nodeID}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: name, Help: help, ConstLabels: labels}
	}
	hist := func(name, help string, buckets []float64) prometheus.HistogramOpts {
		o := opts(name, help)
		return prometheus.HistogramOpts{Namespace: o.Namespace, Subsystem: o.Subsystem,
			Name: o.Name, Help: o.Help, ConstLabels: o.ConstLabels, Buckets: buckets}
	}
	m := &metrics{
		applyLatency: prometheus.NewHistogramVec(hist("apply_duration_seconds",
			"Time from a command reaching the leader's batcher to its result, by command type.",
			prometheus.ExponentialBuckets(0.0005, 2, 16)), []string{"type"}),
		recallWait: prometheus.NewHistogram(hist("recall_wait_seconds",
			"Time a command waited for other sessions' capabilities to be released or revoked.",
			prometheus.ExponentialBuckets(0.0005, 2, 16))),
		batchCommands: prometheus.NewHistogram(hist("batch_commands",
			"Commands carried by one Raft log entry.",
			prometheus.ExponentialBuckets(1, 2, 10))),
		batchBytes: prometheus.NewHistogram(hist("batch_bytes",
			"Encoded size of one batched Raft log entry.",
			prometheus.ExponentialBuckets(256, 4, 10))),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts(opts("commands_total",
			"Commands applied through this node as leader, by type and result errno (0 = success).")),
			[]string{"type", "errno"}),
		queryLatency: prometheus.NewHistogramVec(hist("query_duration_seconds",
			"Time to answer a query served by this node, by consistency level.",
			prometheus.ExponentialBuckets(0.0001, 2, 16)), []string{"consistency"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts(opts("forwarded_total",
			"Requests this follower forwarded to the leader, by RPC.")), []string{"rpc"}),
		raftState: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("raft_state",
			"1 for the node's current Raft state, 0 for the others.")), []string{"state"}),
		undecodable: prometheus.NewCounter(prometheus.CounterOpts(opts("undecodable_entries_total",
			"Log entries this node could not decode or apply (should stay 0)."))),
		panics: prometheus.NewCounter(prometheus.CounterOpts(opts("recovered_panics_total",
			"Panics recovered in request handlers (should stay 0)."))),
	}
	m.collectors = []prometheus.Collector{m.applyLatency, m.recallWait, m.batchCommands, m.batchBytes,
		m.commands, m.queryLatency, m.forwarded, m.raftState, m.undecodable, m.panics}
	gauge := func(name, help string, f func(fsm.Stats) float64) {
		m.collectors = append(m.collectors, prometheus.NewGaugeFunc(
			prometheus.GaugeOpts(opts(name, help)), func() float64 { return f(stats()) }))
	}
	// The node's index, not the state machine's: the state machine sees
	// only file system entries, so on a cluster nobody wrote to yet it
	// would read 0 while memfs status shows the configuration entries.
	m.collectors = append(m.collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("fsm_applied_index",
		"Last Raft log index this node has applied (file system, metadata and configuration entries alike).")),
		func() float64 { return float64(applied()) }))
	gauge("fsm_inodes", "Inodes in use.", func(s fsm.Stats) float64 { return float64(s.Inodes) })
	gauge("fsm_logical_bytes", "Sum of regular file sizes.",
		func(s fsm.Stats) float64 { return float64(s.LogicalBytes) })
	gauge("fsm_physical_bytes", "Bytes of unique stored blocks.",
		func(s fsm.Stats) float64 { return float64(s.Block.PhysicalBytes) })
	gauge("fsm_blocks", "Unique stored blocks.", func(s fsm.Stats) float64 { return float64(s.Block.Blocks) })
	gauge("fsm_memory_limit_bytes", "Block memory budget (0 = none): the leader's stamp, which its whole-process limit leaves to blocks.",
		func(s fsm.Stats) float64 { return float64(s.Block.Limit) })
	m.collectors = append(m.collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("block_memory_bytes",
		"Resident memory of the process's blocks (pages of live block slots, off the Go heap); process_resident_memory_bytes is the whole process.")),
		func() float64 { return float64(block.Arena().Resident) }))
	gauge("fsm_sessions", "Open client sessions.", func(s fsm.Stats) float64 { return float64(s.Sessions) })
	gauge("fsm_capabilities", "Capabilities held by client sessions.", func(s fsm.Stats) float64 { return float64(s.Caps) })
	gauge("fsm_shared_bytes", "Bytes of stored blocks held by more than one reference.",
		func(s fsm.Stats) float64 { return float64(s.Block.SharedBytes) })
	gauge("fsm_ref_bytes", "Bytes covered by all block references (what a store without dedup would hold).",
		func(s fsm.Stats) float64 { return float64(s.Block.RefBytes) })
	counter := func(name, help string, v *atomic.Uint64) {
		m.collectors = append(m.collectors, prometheus.NewCounterFunc(
			prometheus.CounterOpts(opts(name, help)), func() float64 { return float64(v.Load()) }))
	}
	counter("raft_log_bytes_total", "Payload bytes appended to this node's Raft log.", &tr.logBytes)
	counter("raft_net_sent_bytes_total", "Bytes the Raft transport sent to other nodes.", &tr.netSent)
	counter("raft_net_received_bytes_total", "Bytes the Raft transport received from other nodes.", &tr.netReceived)
	counter("wire_dedup_bytes_total", "Write bytes this leader put in the log as block hashes instead of data.", &tr.dedupBytes)
	counter("wire_dedup_commands_total", "Writes this leader sent with at least one block by hash.", &tr.dedupCommands)
	counter("wire_dedup_resends_total", "By-hash writes refused (a block was freed meanwhile) and resent with data.", &tr.dedupResends)
	return m
}

// register adds the metrics to reg; a nil reg keeps them private.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			m.unregister(reg)
			return err
		}
	}
	return nil
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	for _, c := range m.collectors {
		reg.Unregister(c)
	}
}

var raftStates = []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown}

func (m *metrics) setRaftState(s raft.RaftState) {
	for _, st := range raftStates {
		v := 0.0
		if st == s {
			v = 1
		}
		m.raftState.WithLabelValues(st.String()).Set(v)
	}
}

// commandDone counts one command's result and the time since start.
func (m *metrics) commandDone(typ string, errno uint32, took time.Duration) {
	m.commands.WithLabelValues(typ, strconv.FormatUint(uint64(errno), 10)).Inc()
	m.applyLatency.WithLabelValues(typ).Observe(took.Seconds())
}

// latencies is each series of vec (one histogram per value of label) as
// the Status call reports it, ordered by name. The vectors are read
// whether or not a registry serves them, so every node can report its
// rates to the others' status pages.
func latencies(vec *prometheus.HistogramVec, label string) []*pb.OpLatency {
	ch := make(chan prometheus.Metric)
	go func() {
		vec.Collect(ch)
		close(ch)
	}()
	var out []*pb.OpLatency
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil || d.GetHistogram() == nil {
			continue
		}
		h := d.GetHistogram()
		o := &pb.OpLatency{Count: h.GetSampleCount(), SumSeconds: h.GetSampleSum()}
		for _, l := range d.GetLabel() {
			if l.GetName() == label {
				o.Name = l.GetValue()
			}
		}
		for _, b := range h.GetBucket() {
			if math.IsInf(b.GetUpperBound(), 1) {
				continue
			}
			o.UpperBounds = append(o.UpperBounds, b.GetUpperBound())
			o.CumulativeCounts = append(o.CumulativeCounts, b.GetCumulativeCount())
		}
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b *pb.OpLatency) int { return strings.Compare(a.Name, b.Name) })
	return out
}
