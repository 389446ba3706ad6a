package model

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckTimeout bounds one porcupine check. A check that runs out of time is
// inconclusive: it is reported, never counted as a pass or a failure.
var CheckTimeout = 60 * time.Second

// Verdict is the outcome of checking one history.
type Verdict struct {
	Result porcupine.CheckResult
	Counts Counts
	// Dir holds history.json and visualization.html when the history was
	// saved (a violation or an inconclusive check).
	Dir string
}

// Check verifies that ops is linearizable under FS. On a violation it
// saves the history and porcupine's visualisation, and fails t with the
// seed and where to look; an inconclusive check is logged and saved.
func Check(t testing.TB, seed int64, ops []porcupine.Operation) Verdict {
	t.Helper()
	m := FS()
	res, info := porcupine.CheckOperationsVerbose(m, ops, CheckTimeout)
	v := Verdict{Result: res, Counts: Count(ops)}
	if res == porcupine.Ok {
		t.Logf("linearizable: %d operations (%d unknown) on %d keys, seed %d",
			v.Counts.Ops, v.Counts.Unknown, v.Counts.Keys, seed)
		return v
	}
	dir, err := Save(t.Name(), seed, ops, info)
	v.Dir = dir
	if err != nil {
		t.Logf("saving the history failed: %v", err)
	}
	if res == porcupine.Unknown {
		t.Logf("linearizability check timed out after %v (%d operations, %d unknown): inconclusive; history in %s",
			CheckTimeout, v.Counts.Ops, v.Counts.Unknown, dir)
		return v
	}
	t.Errorf("history is NOT linearizable (seed %d; replay with MEMFS_SEED=%d): %d operations, %d unknown; "+
		"history and visualisation in %s", seed, seed, v.Counts.Ops, v.Counts.Unknown, dir)
	return v
}

// Save writes ops (history.json) and porcupine's visualisation of info
// (visualization.html) into a fresh OutDir and returns it.
func Save(name string, seed int64, ops []porcupine.Operation, info porcupine.LinearizationInfo) (string, error) {
	m := FS()
	dir, err := OutDir(name, seed)
	if err != nil {
		return "", err
	}
	if err := SaveHistory(filepath.Join(dir, "history.json"), ops); err != nil {
		return dir, err
	}
	if err := porcupine.VisualizePath(m, info, filepath.Join(dir, "visualization.html")); err != nil {
		return dir, fmt.Errorf("visualize: %w", err)
	}
	return dir, nil
}
