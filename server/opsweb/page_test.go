package opsweb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/opsweb"
	"github.com/memoryfs/memfs/server/servertest"
)

// TestPageDataFollowsTheCluster checks the status page's data against the
// work done: commands per type with a p99, reads, the cluster's totals
// and members, and the leader, on the leader's page and on a follower's:
// every node's page shows the cluster's rates.
func TestPageDataFollowsTheCluster(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	leader := c.Leader()
	var follower *server.Node
	for _, n := range c.Nodes() {
		if n != leader {
			follower = n
			break
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	urls := map[string]string{}
	for _, n := range []*server.Node{leader, follower} {
		page := opsweb.NewPage(ctx, n, slog.Default())
		srv := httptest.NewServer(opsweb.Handler(opsweb.Options{Registry: prometheus.NewRegistry(), Ready: n.Ready, Page: page}))
		t.Cleanup(srv.Close)
		urls[n.ID()] = srv.URL
	}

	cl, err := client.New(ctx, c.APIAddrs())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	for i := range 20 {
		require.NoError(t, cl.Mkdir(fmt.Sprintf("/d%d", i), 0o755))
		_, err := cl.Stat(fmt.Sprintf("/d%d", i))
		require.NoError(t, err)
	}

	for id, url := range urls {
		var d opsweb.PageData
		require.Eventually(t, func() bool {
			d = pageData(t, url)
			return d.Cluster.Inodes == 21 && len(d.Cluster.Nodes) == 3 && opRate(d.Commands, "mkdir") > 0 && len(d.Reads) > 0
		}, 60*time.Second, 200*time.Millisecond, "the page of %s never showed the mkdirs and stats", id)

		require.Equal(t, id, d.ServedBy)
		require.Equal(t, leader.ID(), d.Cluster.Leader)
		for _, o := range d.Commands {
			if o.Name == "mkdir" {
				require.NotNil(t, o.P99, "a command that completed in the window has a p99")
				require.Positive(t, *o.P99)
			}
		}
		require.Positive(t, d.NodeOpsRate[leader.ID()], "the leader applied the mkdirs")
		for _, m := range d.Cluster.Nodes {
			require.Equal(t, leader.Raft().CurrentTerm(), m.Term, "%s is in the leader's term", m.ID)
		}
		require.NotEmpty(t, d.LeaderChanges)
		require.Equal(t, leader.ID(), d.LeaderChanges[len(d.LeaderChanges)-1].Leader)
		require.Positive(t, d.WindowSeconds)
		require.Positive(t, d.HeapBytes)

		// The page itself and its script come from the binary.
		for path, want := range map[string]string{"/": "<title>MemoryFS status</title>", "/app.js": "api/status", "/style.css": "font"} {
			resp, err := http.Get(url + path)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, path)
			require.Contains(t, readAll(t, resp), want, path)
		}
	}
}

// pageData asks url's /api/status.
func pageData(t *testing.T, url string) opsweb.PageData {
	t.Helper()
	resp, err := http.Get(url + "/api/status")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var d opsweb.PageData
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
	return d
}

func opRate(ops []opsweb.OpStat, name string) float64 {
	for _, o := range ops {
		if o.Name == name {
			return o.PerSecond
		}
	}
	return 0
}

// TestPageShowsMembersThatDoNotAnswer stops two of three nodes: the page of
// the last one still answers, from its own readings, and names the
// members it could not ask.
func TestPageShowsMembersThatDoNotAnswer(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	n := c.Node(0)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := httptest.NewServer(opsweb.NewPage(ctx, n, slog.Default()))
	t.Cleanup(srv.Close)
	c.Stop(1)
	c.Stop(2)

	var d opsweb.PageData
	require.Eventually(t, func() bool {
		d = pageData(t, srv.URL)
		failed := 0
		for _, m := range d.Cluster.Nodes {
			if m.Error != "" {
				failed++
			}
		}
		return failed == 2
	}, 60*time.Second, 200*time.Millisecond, "the page never named the stopped members")
	require.Len(t, d.Cluster.Nodes, 3)
	require.Equal(t, n.ID(), d.ServedBy)
}
