package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJudgePerf(t *testing.T) {
	rep := benchReport{Phases: []phaseResult{
		{Phase: "write", MBPerSec: 30, P99Ms: 900},
		{Phase: "create", OpsPerSec: 400, P99Ms: 120},
	}}
	o := &checkPerfOptions{minWriteMBps: 20, maxWriteP99: 2 * time.Second,
		minCreatesSec: 500, maxCreateP99: 500 * time.Millisecond}
	var out bytes.Buffer
	err := o.judgePerf(&out, rep)
	require.ErrorIs(t, err, errPerfFailed)
	require.Equal(t, `PASS: write throughput 30.0 MB/s (want at least 20.0)
PASS: write p99 900 ms (want at most 2000)
FAIL: creates 400/s (want at least 500)
PASS: create p99 120.0 ms (want at most 500)
FAIL
`, out.String())

	o.minCreatesSec = 300
	out.Reset()
	require.NoError(t, o.judgePerf(&out, rep))
	require.True(t, strings.HasSuffix(out.String(), "\nPASS\n"), out.String())
}

// TestCheckPerfRuns runs the real load against a cluster with targets
// any machine meets, and with one no machine meets: the verdict and the
// exit status follow the targets, not the machine's speed.
func TestCheckPerfRuns(t *testing.T) {
	m := upCLI(t)
	lenient := []string{"check", "perf", "--load", "s", "--max-write-p99", "1h", "--max-create-p99", "1h"}

	out, errOut, code := m.run("", append(lenient, "--min-write-mbps", "0.001", "--min-creates", "0.001")...)
	require.Zero(t, code, errOut)
	require.Equal(t, 4, strings.Count(out, "PASS: "), out)
	require.True(t, strings.HasSuffix(out, "\nPASS\n"), out)
	require.Empty(t, m.ok("ls", "/"), "the load removed what it wrote")

	out, errOut, code = m.run("", append(lenient, "--min-write-mbps", "1e12", "--min-creates", "0.001")...)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "FAIL: write throughput")
	require.True(t, strings.HasSuffix(out, "\nFAIL\n"), out)
	require.Equal(t, "memfs: check perf: FAIL\n", errOut[strings.LastIndex(errOut[:len(errOut)-1], "\n")+1:])
}
