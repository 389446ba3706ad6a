package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/internal/promstat"
)

// metricsText is a node's /metrics as topRows reads it.
func metricsText(node, state string, applied, cmds int, at time.Time) promstat.Snapshot {
	text := fmt.Sprintf(`# TYPE memfs_server_raft_state gauge
memfs_server_raft_state{node=%[1]q,state="Leader"} %[2]d
memfs_server_raft_state{node=%[1]q,state="Follower"} %[3]d
# TYPE memfs_server_fsm_applied_index gauge
memfs_server_fsm_applied_index{node=%[1]q} %[4]d
# TYPE memfs_server_fsm_physical_bytes gauge
memfs_server_fsm_physical_bytes{node=%[1]q} 1048576
# TYPE memfs_server_apply_duration_seconds histogram
memfs_server_apply_duration_seconds_bucket{node=%[1]q,type="write",le="0.001"} %[5]d
memfs_server_apply_duration_seconds_bucket{node=%[1]q,type="write",le="0.01"} %[5]d
memfs_server_apply_duration_seconds_bucket{node=%[1]q,type="write",le="+Inf"} %[5]d
memfs_server_apply_duration_seconds_sum{node=%[1]q,type="write"} 0
memfs_server_apply_duration_seconds_count{node=%[1]q,type="write"} %[5]d
`, node, b2i(state == "Leader"), b2i(state == "Follower"), applied, cmds)
	s, err := promstat.Parse(strings.NewReader(text), at)
	if err != nil {
		panic(err)
	}
	return s
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestTopRows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	nodes := []*topNode{
		{addr: "b", prev: metricsText("n2", "Follower", 90, 0, t0), cur: metricsText("n2", "Follower", 95, 0, t0.Add(2*time.Second))},
		{addr: "a", prev: metricsText("n1", "Leader", 90, 10, t0), cur: metricsText("n1", "Leader", 100, 50, t0.Add(2*time.Second))},
		{addr: "c", err: fmt.Errorf("connection refused")},
		{addr: "d", cur: metricsText("n3", "Follower", 100, 0, t0)}, // one reading: no rates yet
	}
	rows := topRows(nodes)
	byAddr := map[string]topRow{}
	for _, r := range rows {
		byAddr[r.addr] = r
	}
	require.Equal(t, "n1", byAddr["a"].id)
	require.Equal(t, "Leader", byAddr["a"].state)
	require.InDelta(t, 20.0, byAddr["a"].commands, 1e-9, "40 commands in 2 s")
	require.InDelta(t, 0.00099, byAddr["a"].commandP99, 1e-9, "interpolated inside the lowest bucket, as histogram_quantile does")
	require.Zero(t, byAddr["a"].lag)
	require.InDelta(t, 5.0, byAddr["b"].lag, 1e-9, "95 applied, the most advanced node 100")
	require.True(t, math.IsNaN(byAddr["b"].commandP99), "a follower applies no commands as leader")
	require.Equal(t, "connection refused", byAddr["c"].err)
	require.Zero(t, byAddr["d"].commands)
	table := renderTop(rows)
	require.Contains(t, table, "error: connection refused")
	require.Regexp(t, `(?m)^n1 +Leader +20\.0 +990µs`, table)
}

// TestTopLiveUnderTmux runs memfs top on a real terminal against a
// cluster that is being written to, and quits it with q.
func TestTopLiveUnderTmux(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	tm := newTmux(t)
	bin, p, base := upReady(t)
	metrics := fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", base+201, base+202, base+203)

	// Scripts get one plain table.
	out := runOK(t, bin, "top", "--metrics", metrics, "--interval", "500ms")
	require.Regexp(t, `(?m)^NODE +STATE +CMDS/S`, out)
	for _, id := range []string{"n1", "n2", "n3"} {
		require.Regexp(t, `(?m)^`+id+` +(Leader|Follower) `, out)
	}

	tm.run("top", fmt.Sprintf("%s top --metrics %s --interval 1s; echo status=$?; sleep 600", bin, metrics), 140, 20)
	tm.waitScreen("top", "memfs top", time.Minute)
	// Load: the leader's commands per second rise above zero on screen.
	local := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(local, []byte("x"), 0o644))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = exec.Command(bin, "--cluster", p.cluster, "put", local, fmt.Sprintf("/f%d", i)).Run()
		}
	}()
	leaderBusy := regexp.MustCompile(`(?m)^n\d +Leader +([1-9]\d*\.\d|0\.[1-9])`)
	var screen string
	require.Eventually(t, func() bool {
		screen = tm.screen("top")
		return leaderBusy.MatchString(screen)
	}, 2*time.Minute, 200*time.Millisecond, "the leader's commands/s never showed; screen:\n%s", &screen)
	close(stop)
	<-done
	for _, id := range []string{"n1", "n2", "n3"} {
		require.Regexp(t, `(?m)^`+id+` +(Leader|Follower) `, screen)
	}
	out2, err := exec.Command("tmux", "-L", tm.socket, "send-keys", "-t", "top", "q").CombinedOutput()
	require.NoError(t, err, "%s", out2)
	require.Contains(t, tm.waitScreen("top", "status=", 30*time.Second), "status=0")
}
