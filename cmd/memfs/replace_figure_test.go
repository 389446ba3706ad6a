package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNodeReplaceLatencyFigure measures the figure of docs/benchmarks.md
// ("Node replacement"): the write latency of a steady writer before,
// during and after `memfs node replace`, on a `memfs up` cluster of node
// processes. It runs only when asked:
//
//	MEMFS_REPLACE_FIGURE=1 [MEMFS_REPLACE_FIGURE_MB=256] [MEMFS_REPLACE_FIGURE_BASE=50000] \
//	  go test ./cmd/memfs -run TestNodeReplaceLatencyFigure -v -timeout 30m
func TestNodeReplaceLatencyFigure(t *testing.T) {
	if os.Getenv("MEMFS_REPLACE_FIGURE") == "" {
		t.Skip("a measurement: set MEMFS_REPLACE_FIGURE=1")
	}
	mb := envInt(t, "MEMFS_REPLACE_FIGURE_MB", 256)
	for i, which := range []string{"follower", "leader"} {
		t.Run(which, func(t *testing.T) {
			bin := memfsBinary(t)
			base := envInt(t, "MEMFS_REPLACE_FIGURE_BASE", 0)
			if base == 0 {
				base = freeBasePort(t, 5)
			} else {
				base += 10 * i // each run on its own ports
			}
			p := startUp(t, bin, t.TempDir(), base)
			st := waitStatus(t, bin, p)
			old := "n2"
			if which == "leader" {
				old = st.Leader
			} else if st.Leader == old {
				old = "n3"
			}
			addrs := strings.Split(p.cluster, ",")
			preload(t, addrs, mb, 1<<20)

			spare := startSpareAt(t, bin, "n4", fmt.Sprintf("127.0.0.1:%d", base+104), fmt.Sprintf("127.0.0.1:%d", base+4))
			w := startWriter(t, addrs, 10*time.Millisecond)
			window := 10 * time.Second
			<-time.After(window) // the "before" window
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, "node", "replace", old, "--with", spare.with(), "--cluster", p.cluster)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			end := time.Now()
			require.NoError(t, err, "%s\n%s", &stdout, &stderr)
			<-time.After(window / 2) // the "after" window
			w.finish()
			require.Empty(t, w.errs)
			load, _ := os.ReadFile("/proc/loadavg")

			type win struct {
				name     string
				from, to time.Time
			}
			fmt.Printf("replace %s (%s) with %d MiB stored; load %s", which, old, mb, load)
			fmt.Printf("%s%s", &stdout, &stderr)
			for _, ws := range []win{
				{"before", start.Add(-window), start},
				{"during", start, end},
				{"after", end, end.Add(window / 2)},
			} {
				var lat []time.Duration
				for k, at := range w.at {
					if !at.Before(ws.from) && at.Before(ws.to) {
						lat = append(lat, w.lat[k])
					}
				}
				slices.Sort(lat)
				if len(lat) == 0 {
					continue
				}
				fmt.Printf("| %s | %s | %.1f s | %d | %.1f | %.1f | %.1f |\n", which, ws.name, ws.to.Sub(ws.from).Seconds(), len(lat),
					ms(percentile(lat, 0.50)), ms(percentile(lat, 0.99)), ms(lat[len(lat)-1]))
			}
			p.stop(t)
		})
	}
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, name)
	return n
}
