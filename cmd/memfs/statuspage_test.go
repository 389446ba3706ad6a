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
// --screenshot=...) after the page has had its scripts run; it returns
// stdout.
func chromiumRun(t *testing.T, browser, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1280,900",
		// Virtual time runs the page's fetch and first redraw, then stops.
		"--virtual-time-budget=5000"}, args...)
	cmd := exec.CommandContext(ctx, browser, append(all, url)...)
	out, err := cmd.Output()
	require.NoError(t, err, "chromium %v", args)
	return string(out)
}

var (
	pageValue = regexp.MustCompile(`data-k="([a-z_]+)" data-v="([^"]*)"`)
	pageRow   = regexp.MustCompile(`(?s)<tr data-node="([^"]+)">(.*?)</tr>`)
)

// pageShows is what the page displays: the cards' values and, per
// member, its row's values.
type pageShows struct {
	cards map[string]string
	nodes map[string]map[string]string
}

func readPage(dom string) pageShows {
	p := pageShows{cards: map[string]string{}, nodes: map[string]map[string]string{}}
	cut := regexp.MustCompile(`<table id="members"`).FindStringIndex(dom)
	if cut == nil {
		return p
	}
	for _, m := range pageValue.FindAllStringSubmatch(dom[:cut[0]], -1) {
		p.cards[m[1]] = m[2]
	}
	for _, r := range pageRow.FindAllStringSubmatch(dom, -1) {
		vals := map[string]string{}
		for _, m := range pageValue.FindAllStringSubmatch(r[2], -1) {
			vals[m[1]] = m[2]
		}
		p.nodes[r[1]] = vals
	}
	return p
}

// TestStatusPageInBrowser opens a node's status page in headless Chromium
// and checks that it shows what memfs status --json says, then saves a
// screenshot (MEMFS_SCREENSHOT=PATH to keep it, as docs/operations.md's).
func TestStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and a browser")
	}
	browser := chromiumOrSkip(t)
	bin := memfsBinary(t)
	base := freeBasePort(t, 3)
	p := startUp(t, bin, t.TempDir(), base, false)
	waitStatus(t, bin, p)

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
	}

	shot := os.Getenv("MEMFS_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "status-page.png")
	}
	chromiumRun(t, browser, url, "--screenshot="+shot)
	png, err := os.ReadFile(shot)
	require.NoError(t, err)
	require.Equal(t, "\x89PNG", string(png[:4]), "a PNG screenshot")
	t.Logf("screenshot in %s", shot)
	p.stop(t)
}
