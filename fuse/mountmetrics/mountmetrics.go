// Package mountmetrics gives a FUSE mount Prometheus metrics: the count,
// errors and latency of every FUSE operation, measured around fsops.Ops,
// and the mount's own counters (cache hits, recalls, write-behind and the
// buffered-metadata journal) read from fsops.ClientOps.Stats.
//
// It only observes: it must never change what an operation does or
// answers, nor hold a lock across one.
package mountmetrics

import (
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memoryfs/memfs/fuse/fsops"
)

const (
	namespace = "memfs"
	subsystem = "mount"
)

// Metrics are one mount's metrics; register them with a registry.
type Metrics struct {
	ops      *prometheus.CounterVec
	errs     *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	stats    func() fsops.Stats
	statDesc map[string]*prometheus.Desc
}

// New makes the metrics of a mount whose counters stats reads.
func New(stats func() fsops.Stats) *Metrics {
	name := func(n string) string { return prometheus.BuildFQName(namespace, subsystem, n) }
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("ops_total"),
			Help: "FUSE operations answered, by operation."}, []string{"op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("op_errors_total"),
			Help: "FUSE operations answered with an error, by operation and errno name."}, []string{"op", "errno"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name("op_duration_seconds"),
			Help:    "Time to answer a FUSE operation, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.00002, 2, 18)}, []string{"op"}),
		stats:    stats,
		statDesc: map[string]*prometheus.Desc{},
	}
	for _, s := range statMetrics {
		m.statDesc[s.name] = prometheus.NewDesc(name(s.name), s.help, nil, nil)
	}
	return m
}

// statMetric is one metric read from fsops.Stats.
type statMetric struct {
	name, help string
	kind       prometheus.ValueType
	value      func(fsops.Stats) float64
}

var statMetrics = []statMetric{
	{"meta_cache_hits_total", "Lookups and getattrs answered from the capability cache.", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.MetaHits) }},
	{"meta_cache_misses_total", "Lookups and getattrs the cluster answered.", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.MetaMisses) }},
	{"window_reads_total", "Reads answered from readahead windows or the data cache.", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.WindowReads) }},
	{"cluster_reads_total", "Read calls sent to the cluster (direct reads and window fetches).", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.ClusterReads) }},
	{"capability_recalls_total", "Inodes whose capabilities the cluster recalled from this mount.", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.Recalls) }},
	{"write_behind_unsent_bytes", "Bytes of writes acknowledged and not yet committed.", prometheus.GaugeValue,
		func(s fsops.Stats) float64 { return float64(s.UnsentBytes) }},
	{"journal_depth", "Buffered metadata operations answered and not yet committed.", prometheus.GaugeValue,
		func(s fsops.Stats) float64 { return float64(s.JournalDepth) }},
	{"journal_committed_total", "Buffered metadata operations committed.", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.JournalCommitted) }},
	{"journal_failed_total", "Buffered metadata operations lost at commit (should stay 0).", prometheus.CounterValue,
		func(s fsops.Stats) float64 { return float64(s.JournalFailed) }},
}

// journalFlushName is a summary (count and sum) of batch sends.
const journalFlushName = "journal_flush_duration_seconds"

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.ops.Describe(ch)
	m.errs.Describe(ch)
	m.latency.Describe(ch)
	for _, d := range m.statDesc {
		ch <- d
	}
	ch <- m.flushDesc()
}

func (m *Metrics) flushDesc() *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, journalFlushName),
		"Time to send one batch of buffered metadata operations until the cluster answered.", nil, nil)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.ops.Collect(ch)
	m.errs.Collect(ch)
	m.latency.Collect(ch)
	s := m.stats()
	for _, sm := range statMetrics {
		ch <- prometheus.MustNewConstMetric(m.statDesc[sm.name], sm.kind, sm.value(s))
	}
	ch <- prometheus.MustNewConstSummary(m.flushDesc(), uint64(s.JournalBatches), s.JournalFlushTime.Seconds(), nil)
}

// observe records one operation that began at start and answered e.
// Observe counts one operation and its answer (an fsops.Observer).
func (m *Metrics) Observe(op string, start time.Time, e syscall.Errno) {
	m.ops.WithLabelValues(op).Inc()
	m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if e != 0 {
		m.errs.WithLabelValues(op, errnoName(e)).Inc()
	}
}

// errnoName is the errno's C name (ENOENT), or its number.
func errnoName(e syscall.Errno) string {
	if n, ok := errnoNames[e]; ok {
		return n
	}
	return e.Error()
}

var errnoNames = map[syscall.Errno]string{
	syscall.ENOENT: "ENOENT", syscall.EEXIST: "EEXIST", syscall.ENOTDIR: "ENOTDIR", syscall.EISDIR: "EISDIR",
	syscall.ENOTEMPTY: "ENOTEMPTY", syscall.EBADF: "EBADF", syscall.EINVAL: "EINVAL",
	syscall.ENAMETOOLONG: "ENAMETOOLONG", syscall.ENOSPC: "ENOSPC", syscall.EBUSY: "EBUSY",
	syscall.EWOULDBLOCK: "EWOULDBLOCK", syscall.EIO: "EIO", syscall.EACCES: "EACCES", syscall.EPERM: "EPERM",
	syscall.ENODATA: "ENODATA", syscall.ERANGE: "ERANGE", syscall.EXDEV: "EXDEV", syscall.EINTR: "EINTR",
	syscall.ENOSYS: "ENOSYS", syscall.EROFS: "EROFS", syscall.EMLINK: "EMLINK", syscall.ELOOP: "ELOOP",
	syscall.EFBIG: "EFBIG", syscall.ENOTSUP: "ENOTSUP", syscall.ENXIO: "ENXIO",
}
