package opsweb_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/opsweb"
	"github.com/memoryfs/memfs/server/servertest"
)

// serveNode serves n's operator endpoints on a test HTTP server.
func serveNode(t *testing.T, n *server.Node) string {
	t.Helper()
	srv := httptest.NewServer(opsweb.Handler(opsweb.Options{Registry: prometheus.NewRegistry(), Ready: n.Ready}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// readAll reads and closes resp's body.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// get returns the status code and body of addr's path.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	require.NoError(t, err)
	return resp.StatusCode, readAll(t, resp)
}

func TestReadyzFollowsTheCluster(t *testing.T) {
	c := servertest.StartCluster(t, 3)
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, serveNode(t, n))
	}
	for _, a := range addrs {
		require.Eventually(t, func() bool { code, _ := get(t, a, "/readyz"); return code == http.StatusOK },
			30*time.Second, 50*time.Millisecond, "every member of a cluster with a leader is ready")
		code, body := get(t, a, "/livez")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ok\n", body)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		require.NoError(t, opsweb.Probe(ctx, a, "/readyz"))
		cancel()
	}

	// A node nobody added is alive but not ready.
	spare, err := server.New(context.Background(), server.Config{ID: "spare",
		DataDir: filepath.Join(t.TempDir(), "spare"), RaftAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = spare.Close(context.Background()) })
	sa := serveNode(t, spare)
	code, body := get(t, sa, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not a member")
	code, _ = get(t, sa, "/livez")
	require.Equal(t, http.StatusOK, code)

	// The last node of three knows no leader once the others are gone:
	// still alive, no longer ready, and Probe says why.
	last := c.Index(c.Leader())
	for i := range 3 {
		if i != last {
			c.Stop(i)
		}
	}
	require.Eventually(t, func() bool {
		code, body := get(t, addrs[last], "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no leader")
	}, 60*time.Second, 100*time.Millisecond)
	code, _ = get(t, addrs[last], "/livez")
	require.Equal(t, http.StatusOK, code)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = opsweb.Probe(ctx, addrs[last], "/readyz")
	require.ErrorContains(t, err, "503 Service Unavailable: not ready: no leader known")
}

func TestReadyzWithoutReadyFuncAnswersLikeLivez(t *testing.T) {
	srv := httptest.NewServer(opsweb.Handler(opsweb.Options{Registry: prometheus.NewRegistry()}))
	defer srv.Close()
	a := strings.TrimPrefix(srv.URL, "http://")
	for _, p := range []string{"/livez", "/readyz"} {
		code, body := get(t, a, p)
		require.Equal(t, http.StatusOK, code, p)
		require.Equal(t, "ok\n", body, p)
	}
	code, body := get(t, a, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "memfs_server_") // an empty registry
}
