package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/internal/progress"
	"github.com/memoryfs/memfs/internal/promstat"
)

type topOptions struct {
	metrics  string
	interval time.Duration
}

func newTopCmd() *cobra.Command {
	o := &topOptions{}
	cmd := &cobra.Command{
		Use:   "top",
		Short: "A live view of every node: operations/s, p99 latency, lag and memory",
		Long: `Show every node's operations per second and p99 latency (commands the
leader applied, reads each node answered), its applied index and how far it
trails the most advanced node, its Raft state, and its memory: stored
blocks against the limit and the process's resident size. The numbers come
from the nodes' --metrics-addr (/metrics), read every --interval; rates are
over the last interval. q or Ctrl-C quits. When standard output is not a
terminal, one table is printed after one interval, for scripts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runTop(cmd, args, o) },
	}
	def := os.Getenv("MEMFS_METRICS")
	if def == "" {
		def = "127.0.0.1:7201,127.0.0.1:7202,127.0.0.1:7203" // memfs up's
	}
	cmd.Flags().StringVar(&o.metrics, "metrics", def, "comma-separated --metrics-addr of the nodes (env MEMFS_METRICS)")
	cmd.Flags().DurationVar(&o.interval, "interval", 2*time.Second, "how often to read the nodes")
	return cmd
}

// topNode is one node's last two readings.
type topNode struct {
	addr      string
	prev, cur promstat.Snapshot
	err       error
}

// topRow is one line of the view.
type topRow struct {
	addr, id, state         string
	commands, reads         float64 // per second
	commandP99, readP99     float64 // seconds; NaN when none completed
	applied, lag            float64
	physical, limit, rssMem float64
	err                     string
}

// scrapeAll reads every node's /metrics at once, each bounded by timeout.
func scrapeAll(ctx context.Context, nodes []*topNode, timeout time.Duration) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			s, err := scrapeMetrics(sctx, n.addr)
			if err != nil {
				n.err = err
				return
			}
			n.err = nil
			n.prev, n.cur = n.cur, s
		})
	}
	wg.Wait()
}

func scrapeMetrics(ctx context.Context, addr string) (promstat.Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return promstat.Snapshot{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return promstat.Snapshot{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return promstat.Snapshot{}, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	return promstat.Parse(resp.Body, time.Now())
}

// topRows computes the view from the nodes' readings: rates and p99 need
// two readings, the rest one.
func topRows(nodes []*topNode) []topRow {
	var rows []topRow
	maxApplied := 0.0
	for _, n := range nodes {
		r := topRow{addr: n.addr, commandP99: math.NaN(), readP99: math.NaN()}
		if n.err != nil || n.cur.Families == nil {
			r.err = "no answer"
			if n.err != nil {
				r.err = n.err.Error()
			}
			rows = append(rows, r)
			continue
		}
		c := n.cur
		for state, v := range c.Values("memfs_server_raft_state", "state") {
			if v == 1 {
				r.state = state
			}
		}
		for id := range c.Values("memfs_server_fsm_applied_index", "node") {
			r.id = id
		}
		r.applied = c.Values("memfs_server_fsm_applied_index", "")[""]
		r.physical = c.Values("memfs_server_fsm_physical_bytes", "")[""]
		r.limit = c.Values("memfs_server_fsm_memory_limit_bytes", "")[""]
		r.rssMem = c.Values("process_resident_memory_bytes", "")[""]
		maxApplied = max(maxApplied, r.applied)
		if n.prev.Families != nil {
			secs := c.At.Sub(n.prev.At).Seconds()
			r.commands, r.commandP99 = windowOf(n.prev, c, "memfs_server_apply_duration_seconds", secs)
			r.reads, r.readP99 = windowOf(n.prev, c, "memfs_server_query_duration_seconds", secs)
		}
		rows = append(rows, r)
	}
	for i := range rows {
		if rows[i].err == "" {
			rows[i].lag = maxApplied - rows[i].applied
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].id < rows[j].id })
	return rows
}

// windowOf is the rate and p99 of all series of a latency histogram
// between two readings secs apart.
func windowOf(prev, cur promstat.Snapshot, hist string, secs float64) (rate, p99 float64) {
	d := cur.Histograms(hist, "")[""].Since(prev.Histograms(hist, "")[""])
	if secs <= 0 {
		return 0, math.NaN()
	}
	return d.Count / secs, d.Quantile(0.99)
}

// renderTop draws the rows as a table.
func renderTop(rows []topRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %-10s %10s %10s %10s %10s %10s %7s %11s %11s %10s\n", "NODE", "STATE",
		"CMDS/S", "CMD P99", "READS/S", "READ P99", "APPLIED", "LAG", "STORED", "LIMIT", "RSS")
	for _, r := range rows {
		if r.err != "" {
			fmt.Fprintf(&b, "%-8s %s\n", r.addr, "error: "+r.err)
			continue
		}
		fmt.Fprintf(&b, "%-8s %-10s %10.1f %10s %10.1f %10s %10.0f %7.0f %11s %11s %10s\n", r.id, r.state,
			r.commands, latency(r.commandP99), r.reads, latency(r.readP99), r.applied, r.lag,
			humanBytes(uint64(r.physical)), humanBytes(uint64(r.limit)), humanBytes(uint64(r.rssMem)))
	}
	return b.String()
}

func latency(s float64) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case s < 1e-3:
		return fmt.Sprintf("%.0fµs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1fms", s*1e3)
	}
	return fmt.Sprintf("%.2fs", s)
}

func runTop(cmd *cobra.Command, _ []string, o *topOptions) error {
	var nodes []*topNode
	for _, a := range strings.Split(o.metrics, ",") {
		if a = strings.TrimSpace(a); a != "" {
			nodes = append(nodes, &topNode{addr: a})
		}
	}
	if len(nodes) == 0 {
		return usageError{fmt.Errorf("no --metrics addresses")}
	}
	if o.interval <= 0 {
		return usageError{fmt.Errorf("--interval must be positive")}
	}
	ctx, stop := interruptContext()
	defer stop()
	if !progress.IsTerminal(cmd.OutOrStdout()) {
		// For scripts: one table over one interval.
		scrapeAll(ctx, nodes, o.interval)
		select {
		case <-time.After(o.interval):
		case <-ctx.Done():
			return ctx.Err()
		}
		scrapeAll(ctx, nodes, o.interval)
		_, err := fmt.Fprint(cmd.OutOrStdout(), renderTop(topRows(nodes)))
		return err
	}
	m := &topModel{ctx: ctx, nodes: nodes, interval: o.interval}
	_, err := tea.NewProgram(m, tea.WithAltScreen(), tea.WithContext(ctx)).Run()
	if err != nil && ctx.Err() != nil {
		return nil // Ctrl-C or SIGTERM: a normal end
	}
	return err
}

// topModel is the live view (bubbletea's model: Init, Update, View).
type topModel struct {
	ctx      context.Context
	nodes    []*topNode
	interval time.Duration
	rows     []topRow
	at       time.Time
}

type topScraped struct{}
type topTick struct{}

func (m *topModel) scrape() tea.Msg {
	scrapeAll(m.ctx, m.nodes, m.interval)
	return topScraped{}
}

func (m *topModel) Init() tea.Cmd { return m.scrape }

func (m *topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		}
	case topScraped:
		m.rows, m.at = topRows(m.nodes), time.Now()
		return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return topTick{} })
	case topTick:
		return m, m.scrape
	}
	return m, nil
}

func (m *topModel) View() string {
	head := fmt.Sprintf("memfs top — %d nodes, every %v (q quits)", len(m.nodes), m.interval)
	if !m.at.IsZero() {
		head += "  " + m.at.Format("15:04:05")
	}
	return head + "\n\n" + renderTop(m.rows) +
		"\nCMDS/S and CMD P99: commands the node applied as leader; READS/S: reads it answered;\nLAG: entries behind the most advanced node; STORED: unique block bytes in memory.\n"
}
