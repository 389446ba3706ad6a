package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNodeReplaceLatencyFigure measures the figure of docs/benchmarks.md
// ("Node replacement"): the write latency of a steady writer before,
// during and after `memfs node replace`, on a `memfs up` cluster of node
// processes. It runs only when asked:
//
//	MEMFS_REPLACE_FIGURE=1 [MEMFS_REPLACE_FIGURE_MB=256] [MEMFS_REPLACE_FIGURE_BASE=22000] \
//	  [MEMFS_REPLACE_FIGURE_SNAPSHOT=128] go test ./cmd/memfs -run TestNodeReplaceLatencyFigure -v -timeout 30m
//
// MEMFS_REPLACE_FIGURE_SNAPSHOT is the nodes' --snapshot-threshold (half
// of it the trailing logs): with the server's default the preload fits in
// the log and the new node catches up by log replay; with 128 the leader
// has cut its log and the new node gets a snapshot and fetches the data
// by block sync. 0 keeps the server's defaults.
func TestNodeReplaceLatencyFigure(t *testing.T) {
	if os.Getenv("MEMFS_REPLACE_FIGURE") == "" {
		t.Skip("a measurement: set MEMFS_REPLACE_FIGURE=1")
	}
	mb := envInt(t, "MEMFS_REPLACE_FIGURE_MB", 256)
	for i, which := range []string{"follower", "leader"} {
		t.Run(which, func(t *testing.T) {
			bin := memfsBinary(t)
			base := freeBasePort(t, 5)
			if lo := envInt(t, "MEMFS_REPLACE_FIGURE_BASE", 0); lo != 0 {
				base = freeBaseFrom(t, lo+10*i, 5)
			}
			var serverArgs []string
			if snap := envInt(t, "MEMFS_REPLACE_FIGURE_SNAPSHOT", 128); snap > 0 {
				serverArgs = []string{"--snapshot-threshold", fmt.Sprint(snap), "--trailing-logs", fmt.Sprint(snap / 2),
					"--snapshot-interval", "1s"}
			}
			p := startUp(t, bin, t.TempDir(), base, false, serverArgs...)
			st := waitStatus(t, bin, p)
			old := "n2"
			if which == "leader" {
				old = st.Leader
			} else if st.Leader == old {
				old = "n3"
			}
			// The spare takes its ports now, before the preload gives other
			// processes a minute to take them as ephemeral ports.
			spare := startSpareAt(t, bin, "n4", fmt.Sprintf("127.0.0.1:%d", base+104), fmt.Sprintf("127.0.0.1:%d", base+4))
			addrs := strings.Split(p.cluster, ",")
			preload(t, addrs, mb, 1<<20)

			w := startWriter(t, addrs, 10*time.Millisecond)
			window := 10 * time.Second
			<-time.After(window) // the "before" window
			var stdout bytes.Buffer
			stderr := &stampedLines{}
			cmd := exec.Command(bin, "node", "replace", old, "--with", spare.with(), "--cluster", p.cluster)
			cmd.Stdout, cmd.Stderr = &stdout, stderr
			start := time.Now()
			err := cmd.Run()
			end := time.Now()
			require.NoError(t, err, "%s\n%s", &stdout, stderr)
			<-time.After(window / 2) // the "after" window
			w.finish()
			require.Empty(t, w.errs)
			load, _ := os.ReadFile("/proc/loadavg")

			type win struct {
				name     string
				from, to time.Time
			}
			fmt.Printf("replace %s (%s) with %d MiB stored; load %s", which, old, mb, load)
			fmt.Printf("%s%s", &stdout, stderr)
			promote := stderr.first("promoting")
			require.False(t, promote.IsZero())
			for _, ws := range []win{
				{"before", start.Add(-window), start},
				{"during", start, end},
				{"during: add and catch-up", start, promote},
				{"during: promote and remove", promote, end},
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

// freeBaseFrom is freeBasePort counting up from lo in steps of 300 (one
// memfs up's port span), for runs by hand that must stay in a given port
// range.
func freeBaseFrom(t *testing.T, lo, n int) int {
	t.Helper()
	for base := lo; base < lo+6000; base += 300 {
		if basePortFree(base, n) {
			return base
		}
	}
	t.Fatalf("no free ports from %d", lo)
	return 0
}

// stampedLines keeps a command's output lines with their arrival times.
type stampedLines struct {
	mu    sync.Mutex
	buf   []byte
	lines []string
	at    []time.Time
}

func (s *stampedLines) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		s.lines = append(s.lines, string(s.buf[:i]))
		s.at = append(s.at, time.Now())
		s.buf = s.buf[i+1:]
	}
}

// first returns when the first line containing sub arrived.
func (s *stampedLines) first(sub string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, l := range s.lines {
		if strings.Contains(l, sub) {
			return s.at[i]
		}
	}
	return time.Time{}
}

func (s *stampedLines) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n") + "\n" + string(s.buf)
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
