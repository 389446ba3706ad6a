package opsweb

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"runtime/metrics"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memoryfs/memfs/internal/promstat"
	"github.com/memoryfs/memfs/internal/statusreport"
	"github.com/memoryfs/memfs/server"
)

// The page's files are in the binary: a status page must work where
// nothing outside the cluster can be reached.
//
//go:embed assets
var assets embed.FS

// How the page samples: the node's metrics every sampleEvery, rates and
// p99 over the last rateWindow, the cluster status every statusEvery, and
// leader changes kept for leaderHistory.
const (
	sampleEvery   = time.Second
	rateWindow    = 10 * time.Second
	statusEvery   = 2 * time.Second
	leaderHistory = time.Hour
)

// Page is a node's status page: the files at / and its data at
// /api/status. A background loop gathers what the page shows, so a
// request only copies the latest reading and never waits on the network:
// however many browsers poll, the node asks its peers once per
// statusEvery.
type Page struct {
	node *server.Node
	reg  prometheus.Gatherer
	log  *slog.Logger
	mux  *http.ServeMux

	mu      sync.Mutex
	samples []promstat.Snapshot // oldest first, spanning rateWindow; guarded by mu
	leaders []LeaderChange      // within leaderHistory; guarded by mu
	cluster statusreport.Report // guarded by mu
	asked   time.Time           // when cluster was read; guarded by mu
}

// LeaderChange is a leader (or term) this node saw begin.
type LeaderChange struct {
	Time   time.Time `json:"time"`
	Term   uint64    `json:"term"`
	Leader string    `json:"leader"` // "" while no leader is known
}

// OpStat is one kind of command or read over the rate window.
type OpStat struct {
	Name      string   `json:"name"`
	PerSecond float64  `json:"per_second"`
	P99       *float64 `json:"p99_seconds"` // nil when none completed in the window
}

// PageData is what /api/status answers.
type PageData struct {
	ServedBy      string              `json:"served_by"`
	Time          time.Time           `json:"time"`
	StatusAge     float64             `json:"status_age_seconds"` // how old Cluster is
	Cluster       statusreport.Report `json:"cluster"`
	Capabilities  uint64              `json:"capabilities"`
	HeapBytes     uint64              `json:"heap_bytes"`
	LeaderChanges []LeaderChange      `json:"leader_changes"`
	WindowSeconds float64             `json:"window_seconds"`
	Commands      []OpStat            `json:"commands"` // applied through this node as leader
	Reads         []OpStat            `json:"reads"`    // queries this node answered
}

// NewPage starts gathering for n's page from reg (the registry n's
// metrics are in) until ctx ends.
func NewPage(ctx context.Context, n *server.Node, reg prometheus.Gatherer, log *slog.Logger) *Page {
	p := &Page{node: n, reg: reg, log: log, mux: http.NewServeMux()}
	sub, _ := fs.Sub(assets, "assets")
	p.mux.Handle("/", http.FileServerFS(sub))
	p.mux.HandleFunc("/api/status", p.serveStatus)
	go p.loop(ctx)
	return p
}

func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

func (p *Page) loop(ctx context.Context) {
	p.sample(ctx, time.Now())
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.sample(ctx, now)
		}
	}
}

// sample takes one reading; the cluster status only every statusEvery.
func (p *Page) sample(ctx context.Context, now time.Time) {
	snap, err := promstat.Take(p.reg)
	if err != nil {
		p.log.Warn("status page: read metrics", "err", err)
	}
	term := p.node.Raft().CurrentTerm()
	leader, _ := p.node.Leader()
	p.mu.Lock()
	if err == nil {
		p.samples = append(p.samples, snap)
		for len(p.samples) > 2 && snap.At.Sub(p.samples[1].At) >= rateWindow {
			p.samples = p.samples[1:]
		}
	}
	if l := len(p.leaders); l == 0 || p.leaders[l-1].Term != term || p.leaders[l-1].Leader != leader {
		p.leaders = append(p.leaders, LeaderChange{Time: time.Now(), Term: term, Leader: leader})
	}
	for len(p.leaders) > 1 && time.Since(p.leaders[0].Time) > leaderHistory {
		p.leaders = p.leaders[1:]
	}
	due := p.asked.IsZero() || now.Sub(p.asked) >= statusEvery
	p.mu.Unlock()
	if !due {
		return
	}
	// Each peer is asked with its own 1 s bound; the loop's ticks that
	// fall meanwhile are dropped, not queued.
	rep := statusreport.New(p.node.ClusterStatus(ctx))
	p.mu.Lock()
	p.cluster, p.asked = rep, time.Now()
	p.mu.Unlock()
}

func (p *Page) serveStatus(w http.ResponseWriter, _ *http.Request) {
	d := p.data()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(d)
}

// data assembles the page's data from the latest readings.
func (p *Page) data() PageData {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := PageData{
		ServedBy: p.node.ID(), Time: time.Now(), Cluster: p.cluster,
		StatusAge:     time.Since(p.asked).Seconds(),
		Capabilities:  p.node.FSM().Stats().Caps,
		HeapBytes:     heapBytes(),
		LeaderChanges: append([]LeaderChange(nil), p.leaders...),
		Commands:      []OpStat{}, Reads: []OpStat{},
	}
	if len(p.samples) < 2 {
		return d
	}
	first, last := p.samples[0], p.samples[len(p.samples)-1]
	d.WindowSeconds = last.At.Sub(first.At).Seconds()
	d.Commands = opStats(first, last, "memfs_server_apply_duration_seconds", "type")
	d.Reads = opStats(first, last, "memfs_server_query_duration_seconds", "consistency")
	return d
}

// opStats is the rate and p99 of each label value of a latency
// histogram (its count is the operations), busiest first.
func opStats(first, last promstat.Snapshot, hist, label string) []OpStat {
	secs := last.At.Sub(first.At).Seconds()
	was := first.Histograms(hist, label)
	out := []OpStat{}
	for k, h := range last.Histograms(hist, label) {
		d := h.Since(was[k])
		if d.Count == 0 || secs <= 0 {
			continue
		}
		s := OpStat{Name: k, PerSecond: d.Count / secs}
		if q := d.Quantile(0.99); !math.IsNaN(q) {
			s.P99 = &q
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerSecond != out[j].PerSecond {
			return out[i].PerSecond > out[j].PerSecond
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// heapBytes is the Go heap in use (live and not yet collected), read
// without stopping the world.
func heapBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
