package opsweb

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/memoryfs/memfs/internal/statusreport"
	"github.com/memoryfs/memfs/server"
)

// The page's files are in the binary: a status page must work where
// nothing outside the cluster can be reached.
//
//go:embed assets
var assets embed.FS

// How the page samples: leader changes every sampleEvery, kept for
// leaderHistory; the cluster status every statusEvery, its rates and p99
// over the last rateWindow.
const (
	sampleEvery   = time.Second
	statusEvery   = 2 * time.Second
	rateWindow    = 10 * time.Second
	leaderHistory = time.Hour
)

// Page is a node's status page: the files at / and its data at
// /api/status. A background loop gathers what the page shows, so a
// request only copies the latest reading and never waits on the network:
// however many browsers poll, the node asks its peers once per
// statusEvery.
type Page struct {
	node *server.Node
	log  *slog.Logger
	mux  *http.ServeMux

	mu       sync.Mutex
	readings []reading           // oldest first, spanning rateWindow; guarded by mu
	leaders  []LeaderChange      // within leaderHistory; guarded by mu
	cluster  statusreport.Report // guarded by mu
	asked    time.Time           // when cluster was read; guarded by mu
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
	// The cluster's operations over the window, from every member that
	// answered: commands by type (applied by whichever node led), reads
	// by consistency level (answered by any node); and each member's
	// operations per second, commands and reads together.
	Commands    []OpStat           `json:"commands"`
	Reads       []OpStat           `json:"reads"`
	NodeOpsRate map[string]float64 `json:"node_ops_per_second"`
}

// NewPage starts gathering for n's page until ctx ends.
func NewPage(ctx context.Context, n *server.Node, log *slog.Logger) *Page {
	p := &Page{node: n, log: log, mux: http.NewServeMux()}
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

// sample notes a leader change; the cluster status only every
// statusEvery.
func (p *Page) sample(ctx context.Context, now time.Time) {
	term := p.node.Raft().CurrentTerm()
	leader, _ := p.node.Leader()
	p.mu.Lock()
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
	st := p.node.ClusterStatus(ctx)
	at := time.Now()
	r := readingOf(at, st)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cluster, p.asked = statusreport.New(st), at
	p.readings = append(p.readings, r)
	for len(p.readings) > 2 && at.Sub(p.readings[1].at) >= rateWindow {
		p.readings = p.readings[1:]
	}
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
	}
	if n := len(p.readings); n >= 2 {
		d.WindowSeconds = p.readings[n-1].at.Sub(p.readings[0].at).Seconds()
	}
	d.Commands, d.Reads, d.NodeOpsRate = clusterOps(p.readings)
	return d
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
