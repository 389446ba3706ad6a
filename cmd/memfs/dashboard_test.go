package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/memoryfs/memfs/internal/statusreport"
	pb "github.com/memoryfs/memfs/memfspb"
)

// scrape reads addr's /metrics as memfs top does.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := scrapeMetrics(ctx, addr)
	require.NoError(t, err)
	return s.Families
}

// seriesSet is every series name a scrape exposes (a histogram's _bucket,
// _sum and _count) with the label sets seen for it.
type seriesSet map[string][]map[string]string

func (s seriesSet) add(fams map[string]*dto.MetricFamily) {
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			var names []string
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				names = []string{name + "_bucket", name + "_sum", name + "_count"}
			case dto.MetricType_SUMMARY:
				names = []string{name + "_sum", name + "_count", name}
			default:
				names = []string{name}
			}
			for _, n := range names {
				s[n] = append(s[n], labels)
			}
		}
	}
}

var (
	promqlGroup    = regexp.MustCompile(`\b(by|without|on|ignoring)\s*\([^)]*\)`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?`)
	promqlMatcher  = regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	promqlWords    = []string{"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
		"and", "or", "unless", "offset", "bool", "topk", "bottomk", "abs", "delta", "deriv", "clamp_min", "clamp_max"}
)

// selectors returns the metric names expr selects, each with its label
// matchers.
func selectors(expr string) map[string][][]string {
	e := promqlRange.ReplaceAllString(promqlGroup.ReplaceAllString(expr, ""), "")
	out := map[string][][]string{}
	for _, m := range promqlSelector.FindAllStringSubmatch(e, -1) {
		name := m[1]
		if m[3] != "" || slices.Contains(promqlWords, name) {
			continue // a function or an operator
		}
		out[name] = append(out[name], nil)
		for _, mm := range promqlMatcher.FindAllStringSubmatch(m[2], -1) {
			out[name][len(out[name])-1] = append(out[name][len(out[name])-1], mm[1], mm[2], mm[3])
		}
	}
	return out
}

func TestSelectors(t *testing.T) {
	cases := []struct {
		expr string
		want map[string][][]string
	}{
		{`rate(a_total[1m])`, map[string][][]string{"a_total": {nil}}},
		{`histogram_quantile(0.99, sum by (le, op) (rate(x_bucket{op="w"}[5m])))`,
			map[string][][]string{"x_bucket": {{"op", "=", "w"}}}},
		{`max(a) - b{s!="0"}`, map[string][][]string{"a": {nil}, "b": {{"s", "!=", "0"}}}},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, selectors(tc.expr), tc.expr)
	}
}

// TestGrafanaDashboardSeriesExist starts a cluster with memfs up and a
// mount with --metrics-addr, makes them do every kind of work the
// dashboard shows, and checks that each series the dashboard's
// expressions name exists on their /metrics, with the label values it
// asks for. The same scrapes generate the metric list in
// docs/operations.md and check it is current (MEMFS_UPDATE_DOCS=1
// rewrites it) and that the names follow Prometheus's conventions.
func TestGrafanaDashboardSeriesExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	requireFUSE(t)
	bin, p, base := upReady(t)

	var st statusreport.Report
	require.NoError(t, json.Unmarshal([]byte(runOK(t, bin, "--cluster", p.cluster, "status", "--json")), &st))
	follower := ""
	for _, n := range st.Nodes {
		if n.ID != st.Leader {
			follower = n.APIAddr
		}
	}
	local := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(local, []byte("data"), 0o644))
	runOK(t, bin, "--cluster", p.cluster, "put", local, "/f")
	runOK(t, bin, "--cluster", p.cluster, "cat", "/f")
	// A linearizable read asked of a follower, which forwards it (the
	// client library goes to the leader itself).
	conn, err := adminDial(follower)
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pb.NewMemFSClient(conn).Query(ctx, &pb.QueryRequest{Version: pb.Version,
		Query: &pb.Query{Q: &pb.Query_Statfs{Statfs: &pb.StatfsQuery{}}}})
	require.NoError(t, err)

	dir := t.TempDir()
	lazyUnmountAtCleanup(t, dir)
	mountMetrics := freePorts(t, 1)[0]
	mnt := exec.Command(bin, "--cluster", p.cluster, "mount", "--metrics-addr", mountMetrics, dir)
	require.NoError(t, mnt.Start())
	t.Cleanup(func() { _ = mnt.Process.Signal(syscall.SIGTERM); _ = mnt.Wait() })
	waitFor(t, 30*time.Second, "mount appears", func() bool { return mounted(t, dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "g"), []byte("through the mount"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	_, err = os.Stat(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Syncfs(fd))
	require.NoError(t, unix.Close(fd))

	series := seriesSet{}
	all := map[string]*dto.MetricFamily{}
	for i := 1; i <= 3; i++ {
		fams := scrape(t, fmt.Sprintf("127.0.0.1:%d", base+200+i))
		// The node's applied index, as memfs status shows it, not only
		// the file system entries' (a new cluster has applied several).
		applied := fams["memfs_server_fsm_applied_index"].GetMetric()[0].GetGauge().GetValue()
		require.GreaterOrEqual(t, applied, float64(st.Nodes[i-1].AppliedIndex), "node %d", i)
		series.add(fams)
		mergeFamilies(all, fams)
	}
	fams := scrape(t, mountMetrics)
	series.add(fams)
	mergeFamilies(all, fams)

	raw, err := os.ReadFile("../../docker/grafana/memfs-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	exprs := 0
	for _, panel := range dash.Panels {
		for _, target := range panel.Targets {
			exprs++
			sels := selectors(target.Expr)
			require.NotEmpty(t, sels, "panel %q: %s names no series", panel.Title, target.Expr)
			for name, matchers := range sels {
				seen, ok := series[name]
				require.True(t, ok, "panel %q: no series %s on any node or the mount", panel.Title, name)
				for _, ms := range matchers {
					for i := 0; i+2 < len(ms); i += 3 {
						if ms[i+1] != "=" {
							continue
						}
						require.True(t, slices.ContainsFunc(seen, func(l map[string]string) bool { return l[ms[i]] == ms[i+2] }),
							"panel %q: no series %s{%s=%q}", panel.Title, name, ms[i], ms[i+2])
					}
				}
			}
		}
	}
	require.Greater(t, exprs, 20)

	checkMetricNames(t, all)
	checkMetricsDoc(t, all)
	p.stop(t)
}

// mergeFamilies adds fams' series to all, by family.
func mergeFamilies(all, fams map[string]*dto.MetricFamily) {
	for name, f := range fams {
		if have, ok := all[name]; ok {
			have.Metric = append(have.Metric, f.Metric...)
			continue
		}
		all[name] = f
	}
}

// checkMetricNames holds our metrics to Prometheus's naming rules.
func checkMetricNames(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	require.Empty(t, metricNameProblems(fams), "metric names that break Prometheus's conventions")
}

var metricName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// metricNameProblems lists where our metrics break Prometheus's naming
// rules (https://prometheus.io/docs/practices/naming/): snake case with a
// help text; counters, and only counters, end in _total; a time is in
// seconds and says so (a histogram or summary whose help begins "Time"
// ends in _seconds); no other units than base units; no suffix that a
// histogram's or summary's series would clash with.
func metricNameProblems(fams map[string]*dto.MetricFamily) []string {
	var out []string
	for name, f := range fams {
		if !strings.HasPrefix(name, "memfs_") {
			continue
		}
		bad := func(format string, args ...any) { out = append(out, name+": "+fmt.Sprintf(format, args...)) }
		if !metricName.MatchString(name) {
			bad("not snake case")
		}
		if f.GetHelp() == "" {
			bad("no help text")
		}
		counter := f.GetType() == dto.MetricType_COUNTER
		if counter != strings.HasSuffix(name, "_total") {
			bad("counters, and only counters, end in _total")
		}
		timed := f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY
		if timed && strings.HasPrefix(f.GetHelp(), "Time") && !strings.HasSuffix(name, "_seconds") {
			bad("a time ends in _seconds")
		}
		for _, unit := range []string{"_ms", "_us", "_ns", "_milliseconds", "_microseconds", "_minutes", "_hours",
			"_kb", "_mb", "_gb", "_kib", "_mib", "_gib", "_bits", "_percent"} {
			if strings.Contains(name+"_", unit+"_") {
				bad("%s is not a base unit (seconds, bytes, ratios)", unit[1:])
			}
		}
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if strings.HasSuffix(name, suffix) {
				bad("%s is a histogram's series", suffix)
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestMetricNameProblems(t *testing.T) {
	fam := func(name, help string, typ dto.MetricType) map[string]*dto.MetricFamily {
		return map[string]*dto.MetricFamily{name: {Name: &name, Help: &help, Type: &typ}}
	}
	cases := []struct {
		name string
		fams map[string]*dto.MetricFamily
		want string // "" when the name is fine
	}{
		{"a counter", fam("memfs_x_ops_total", "Ops.", dto.MetricType_COUNTER), ""},
		{"a time histogram", fam("memfs_x_duration_seconds", "Time to do x.", dto.MetricType_HISTOGRAM), ""},
		{"bytes", fam("memfs_x_bytes", "Bytes.", dto.MetricType_GAUGE), ""},
		{"not ours", fam("go_gc_ms", "", dto.MetricType_GAUGE), ""},
		{"a counter without _total", fam("memfs_x_ops", "Ops.", dto.MetricType_COUNTER), "end in _total"},
		{"a gauge with _total", fam("memfs_x_total", "X.", dto.MetricType_GAUGE), "end in _total"},
		{"a time not in seconds", fam("memfs_x_latency", "Time to do x.", dto.MetricType_HISTOGRAM), "_seconds"},
		{"milliseconds", fam("memfs_x_latency_ms", "Latency.", dto.MetricType_GAUGE), "ms is not a base unit"},
		{"mebibytes", fam("memfs_x_mib_total", "X.", dto.MetricType_COUNTER), "mib is not a base unit"},
		{"no help", fam("memfs_x_bytes", "", dto.MetricType_GAUGE), "no help text"},
		{"camel case", fam("memfs_xBytes", "X.", dto.MetricType_GAUGE), "snake case"},
		{"a histogram's suffix", fam("memfs_x_count", "X.", dto.MetricType_GAUGE), "histogram's series"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := metricNameProblems(tc.fams)
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Len(t, got, 1, "%v", got)
			require.Contains(t, got[0], tc.want)
		})
	}
}

const (
	metricsDocBegin = "<!-- metrics:begin (generated by TestGrafanaDashboardSeriesExist; MEMFS_UPDATE_DOCS=1 rewrites it) -->"
	metricsDocEnd   = "<!-- metrics:end -->"
)

// checkMetricsDoc requires docs/operations.md's metric list to be the one
// these scrapes produce.
func checkMetricsDoc(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, "memfs_") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(metricsDocBegin + "\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, name := range names {
		f := fams[name]
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if n := l.GetName(); n != "node" && n != "le" && n != "quantile" {
					labels[n] = true
				}
			}
		}
		ls := make([]string, 0, len(labels))
		for l := range labels {
			ls = append(ls, "`"+l+"`")
		}
		sort.Strings(ls)
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, strings.ToLower(f.GetType().String()),
			strings.Join(ls, ", "), strings.ReplaceAll(f.GetHelp(), "|", "\\|"))
	}
	b.WriteString("\n" + metricsDocEnd)
	want := b.String()

	const path = "../../docs/operations.md"
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	i, j := strings.Index(string(doc), metricsDocBegin), strings.Index(string(doc), metricsDocEnd)
	require.True(t, i >= 0 && j > i, "docs/operations.md has no generated metric list")
	have := string(doc[i : j+len(metricsDocEnd)])
	if os.Getenv("MEMFS_UPDATE_DOCS") == "1" && have != want {
		require.NoError(t, os.WriteFile(path, []byte(string(doc[:i])+want+string(doc[j+len(metricsDocEnd):])), 0o644))
		t.Log("rewrote the metric list in docs/operations.md")
		return
	}
	require.Equal(t, want, have, "docs/operations.md's metric list is stale: run MEMFS_UPDATE_DOCS=1 go test -run TestGrafanaDashboardSeriesExist ./cmd/memfs")
}
