//go:build chaos

package procs

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/memoryfs/memfs/test/workload"
)

// TestSoakProcesses runs MEMFS_SOAK_PROC_HISTORIES (default 100) checked
// histories against process clusters of 3 or 5 nodes, MEMFS_SOAK_PHASES
// (default 10) per cluster, each MEMFS_SOAK_SECONDS (default 5) long.
// With MEMFS_SOAK_BUFFERED=on, one or all of the caching clients of a
// cluster that has them buffer (workload.SoakBuffered).
func TestSoakProcesses(t *testing.T) {
	buffering := os.Getenv("MEMFS_SOAK_BUFFERED") == "on"
	target := envInt("MEMFS_SOAK_PROC_HISTORIES", 100)
	phases := envInt("MEMFS_SOAK_PHASES", 10)
	d := time.Duration(envInt("MEMFS_SOAK_SECONDS", 5)) * time.Second
	base := time.Now().UnixNano() % 1_000_000_007
	if s := os.Getenv("MEMFS_SEED"); s != "" {
		base, _ = strconv.ParseInt(s, 10, 64)
	}
	var histories, ok, bad, unknown, ops atomic.Int64
	var cachingOps, local, recalls, freezes, kills atomic.Int64
	var answered, confirmed, voided, lost atomic.Int64
	t.Cleanup(func() {
		t.Logf("process soak: %d histories (%d operations): %d linearizable, %d violations, %d inconclusive; "+
			"caching readers: %d operations, %d answered locally, %d inodes recalled, %d freezes, %d kills; "+
			"buffering: %d changes answered locally, %d answers confirmed, %d voided, %d journal operations lost",
			histories.Load(), ops.Load(), ok.Load(), bad.Load(), unknown.Load(),
			cachingOps.Load(), local.Load(), recalls.Load(), freezes.Load(), kills.Load(),
			answered.Load(), confirmed.Load(), voided.Load(), lost.Load())
	})
	for k := 0; k < (target+phases-1)/phases; k++ {
		seed := base + int64(k)
		nodes := 3 + 2*rand.New(rand.NewSource(seed)).Intn(2)
		// Caching readers (1 or 2) in half the clusters.
		cachers := workload.SoakCachers(seed, false)
		name := fmt.Sprintf("n%d/seed%d", nodes, seed)
		buffered := 0
		if cachers > 0 {
			name = fmt.Sprintf("n%d+k%d/seed%d", nodes, cachers, seed)
			if buffering {
				buffered = workload.SoakBuffered(seed, cachers)
				name = fmt.Sprintf("n%d+k%db%d/seed%d", nodes, cachers, buffered, seed)
			}
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := Start(t, memfsBin, Options{Nodes: nodes, Seed: seed, Args: serverArgs})
			for p := 0; p < phases; p++ {
				t.Run(fmt.Sprintf("h%d", p), func(t *testing.T) {
					out := processHistory(t, c, seed*100+int64(p), d, fmt.Sprintf("/h%d", p), cachers, buffered)
					histories.Add(1)
					ops.Add(int64(out.Verdict.Counts.Ops))
					if cs := out.Cache; cs != nil {
						cachingOps.Add(cs.Ops.Load())
						local.Add(cs.Local.Load())
						recalls.Add(cs.Recalls.Load())
						freezes.Add(cs.Freezes.Load())
						kills.Add(cs.Kills.Load())
						answered.Add(cs.Answered.Load())
						confirmed.Add(cs.Confirmed.Load())
						voided.Add(cs.Voided.Load())
						lost.Add(cs.Lost.Load())
					}
					switch out.Verdict.Result {
					case porcupine.Ok:
						ok.Add(1)
					case porcupine.Illegal:
						bad.Add(1)
					default:
						unknown.Add(1)
					}
				})
			}
		})
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
