package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/internal/statusreport"
)

// chromiumOrSkip finds Debian's headless-capable chromium.
func chromiumOrSkip(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium is not installed (apt-get install -y chromium): the status page test needs a real browser")
	return ""
}

// chromiumRun runs headless chromium on url with args (--dump-dom,
// --screenshot=...) after the page has had its scripts run for 5 s of
// virtual time; it returns stdout.
func chromiumRun(t *testing.T, browser, url string, args ...string) string {
	t.Helper()
	return chromiumRunFor(t, browser, url, 5*time.Second, args...)
}

// chromiumRunFor is chromiumRun with the page's scripts run for budget of
// virtual time: timers fire at once, but each fetch of the page's data
// stops the clock until the node has answered.
func chromiumRunFor(t *testing.T, browser, url string, budget time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1280,900",
		fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds())}, args...)
	cmd := exec.CommandContext(ctx, browser, append(all, url)...)
	out, err := cmd.Output()
	require.NoError(t, err, "chromium %v", args)
	return string(out)
}

var (
	pageValue    = regexp.MustCompile(`data-k="([a-z0-9_]+)" data-v="([^"]*)"`)
	pageRow      = regexp.MustCompile(`(?s)<tr data-node="([^"]+)">(.*?)</tr>`)
	pageOpRow    = regexp.MustCompile(`(?s)<tr data-op="([^"]+)">(.*?)</tr>`)
	pageBody     = regexp.MustCompile(`<body([^>]*)>`)
	pageAttr     = regexp.MustCompile(`(data-[a-z-]+)="([^"]*)"`)
	pageServedBy = regexp.MustCompile(`<b id="served-by">([^<]*)</b>`)
)

// pageShows is what the page displays: the cards' values and, per
// member, its row's values; per command type and read consistency, its
// row's values; the body's data- attributes (refreshes, time, status
// age) and whom it is served by.
type pageShows struct {
	cards    map[string]string
	nodes    map[string]map[string]string
	commands map[string]map[string]string
	reads    map[string]map[string]string
	body     map[string]string
	servedBy string
}

// rows reads the rows of re in dom, keyed by their first group.
func rows(re *regexp.Regexp, dom string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, r := range re.FindAllStringSubmatch(dom, -1) {
		vals := map[string]string{}
		for _, m := range pageValue.FindAllStringSubmatch(r[2], -1) {
			vals[m[1]] = m[2]
		}
		out[r[1]] = vals
	}
	return out
}

func readPage(dom string) pageShows {
	p := pageShows{cards: map[string]string{}, nodes: map[string]map[string]string{},
		commands: map[string]map[string]string{}, reads: map[string]map[string]string{}, body: map[string]string{}}
	if m := pageBody.FindStringSubmatch(dom); m != nil {
		for _, a := range pageAttr.FindAllStringSubmatch(m[1], -1) {
			p.body[a[1]] = a[2]
		}
	}
	if m := pageServedBy.FindStringSubmatch(dom); m != nil {
		p.servedBy = m[1]
	}
	members := strings.Index(dom, `<table id="members"`)
	commands := strings.Index(dom, `<table id="commands"`)
	reads := strings.Index(dom, `<table id="reads"`)
	if members < 0 || commands < members || reads < commands {
		return p
	}
	for _, m := range pageValue.FindAllStringSubmatch(dom[:members], -1) {
		p.cards[m[1]] = m[2]
	}
	p.nodes = rows(pageRow, dom)
	p.commands = rows(pageOpRow, dom[commands:reads])
	p.reads = rows(pageOpRow, dom[reads:])
	return p
}

// pageTime is the node's time of the last answer the page drew.
func pageTime(t *testing.T, p pageShows) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, p.body["data-time"])
	require.NoError(t, err)
	return at
}

// num is a value the page shows as a number (0 when it shows none).
func num(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
}

// TestStatusPageInBrowser opens a node's status page in headless Chromium
// and checks that it shows what memfs status --json says, then saves a
// screenshot (MEMFS_SCREENSHOT=PATH to keep it).
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and a browser")
	}
	browser := chromiumOrSkip(t)
	bin, p, base := upReady(t)

	// Some files, two of them identical so the dedup ratio is not 1.
	data := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.WriteFile(data, randomData(3<<20, 7), 0o644))
	for _, name := range []string{"/a", "/b"} {
		runOK(t, bin, "--cluster", p.cluster, "put", data, name)
	}
	runOK(t, bin, "--cluster", p.cluster, "mkdir", "/dir")

	url := fmt.Sprintf("http://127.0.0.1:%d/", base+201)
	var shown pageShows
	var want statusreport.Report
	// The page refreshes its cluster view every 2 s: poll until it has
	// caught up with the same state status --json reports.
	require.Eventually(t, func() bool {
		out := runOK(t, bin, "--cluster", p.cluster, "status", "--json")
		require.NoError(t, json.Unmarshal([]byte(out), &want))
		shown = readPage(chromiumRun(t, browser, url, "--dump-dom"))
		if shown.cards["inodes"] != strconv.FormatUint(want.Inodes, 10) {
			return false
		}
		for _, n := range want.Nodes {
			if shown.nodes[n.ID]["applied_index"] != strconv.FormatUint(n.AppliedIndex, 10) {
				return false
			}
		}
		return true
	}, 3*time.Minute, time.Second, "the page never showed the cluster's state; last shown %+v", &shown)

	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	require.Equal(t, want.Leader, shown.cards["leader"])
	require.Equal(t, u(want.Inodes), shown.cards["inodes"])
	require.Equal(t, u(want.LogicalBytes), shown.cards["logical_bytes"])
	require.Equal(t, u(want.PhysicalBytes), shown.cards["physical_bytes"])
	require.Equal(t, u(want.SharedBytes), shown.cards["shared_bytes"])
	require.Equal(t, u(want.MemoryLimit), shown.cards["memory_limit"])
	require.Equal(t, strconv.FormatFloat(want.DedupRatio, 'f', -1, 64), shown.cards["dedup_ratio"])
	require.EqualValues(t, 6<<20, want.LogicalBytes)
	require.Len(t, shown.nodes, 3)
	for _, n := range want.Nodes {
		row := shown.nodes[n.ID]
		require.Equal(t, n.State, row["state"], n.ID)
		require.Equal(t, n.APIAddr, row["api_addr"], n.ID)
		require.Equal(t, strconv.FormatBool(n.Voter), row["voter"], n.ID)
		require.Positive(t, n.Term, n.ID)
		require.Equal(t, u(n.Term), row["term"], n.ID)
	}

	screenshot(t, browser, url, chromiumRun)
	p.stop(t)
}

// screenshot saves the page at url as a PNG, in MEMFS_SCREENSHOT when set
// (docs/operations.md's picture is TestStatusPageUnderLoad's).
func screenshot(t *testing.T, browser, url string, run func(t *testing.T, browser, url string, args ...string) string) {
	t.Helper()
	shot := os.Getenv("MEMFS_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "status-page.png")
	}
	run(t, browser, url, "--screenshot="+shot)
	png, err := os.ReadFile(shot)
	require.NoError(t, err)
	require.Equal(t, "\x89PNG", string(png[:4]), "a PNG screenshot")
	t.Logf("screenshot in %s", shot)
}

// TestStatusPageUnderLoad opens a follower's page in headless Chromium
// while a client writes to the cluster without pause: the page keeps
// refreshing, shows the cluster's command rates and p99 (applied by the
// leader, not by the node serving the page) and the leader's share, and
// between two visits its numbers move with the writes. Its screenshot is
// docs/operations.md's (MEMFS_SCREENSHOT=PATH).
func TestStatusPageUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and a browser")
	}
	browser := chromiumOrSkip(t)
	bin := memfsBinary(t)
	base := freeBasePort(t, 3)
	p := startUp(t, bin, t.TempDir(), base, false)
	st := waitStatus(t, bin, p)
	follower := ""
	for _, n := range st.Nodes {
		if n.ID != st.Leader {
			follower = n.ID
			break
		}
	}
	idx, err := strconv.Atoi(strings.TrimPrefix(follower, "n"))
	require.NoError(t, err, "memfs up names its nodes n1, n2, ...")
	url := fmt.Sprintf("http://127.0.0.1:%d/", base+200+idx)

	// One client writing small files back to back until the test ends.
	w := startWriter(t, strings.Split(p.cluster, ","), time.Millisecond)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			w.finish()
		}
	}
	t.Cleanup(stop)

	// 9 s of the page's time: at least 3 of its 2 s refreshes, each a
	// request to a node of a loaded cluster.
	visit := func() pageShows { return readPage(chromiumRunFor(t, browser, url, 9*time.Second, "--dump-dom")) }
	var first pageShows
	require.Eventually(t, func() bool {
		first = visit()
		wr := first.commands["write"]
		return num(wr["per_second"]) > 0 && num(wr["p99_seconds"]) > 0
	}, 3*time.Minute, time.Second, "the follower's page never showed the writes; last shown %+v", &first)

	require.Equal(t, follower, first.servedBy)
	require.GreaterOrEqual(t, num(first.body["data-refreshes"]), 3.0, "the page refreshed while the cluster was loaded")
	age := num(first.body["data-status-age"])
	require.True(t, age >= 0 && age < 15, "the cluster view is %v s old: the page's reading (every 2 s, 1 s per peer) fell behind", age)
	require.Less(t, num(first.commands["write"]["p99_seconds"]), 60.0)
	require.Positive(t, num(first.nodes[st.Leader]["ops_per_second"]), "the leader applies the writes")
	leaderApplied := func(p pageShows) float64 { return num(p.nodes[st.Leader]["applied_index"]) }
	require.Positive(t, leaderApplied(first))

	// A later visit shows later numbers.
	var second pageShows
	require.Eventually(t, func() bool {
		second = visit()
		return leaderApplied(second) > leaderApplied(first) && num(second.cards["inodes"]) > num(first.cards["inodes"]) &&
			pageTime(t, second).After(pageTime(t, first))
	}, 2*time.Minute, time.Second, "the page's numbers did not move with the writes; first %+v, last %+v", &first, &second)
	require.Positive(t, num(second.commands["write"]["per_second"]))
	screenshot(t, browser, url, func(t *testing.T, browser, url string, args ...string) string {
		return chromiumRunFor(t, browser, url, 9*time.Second, args...)
	})

	stop()
	require.Empty(t, w.errs, "a write failed")
	require.Positive(t, w.count())
	p.stop(t)
}
