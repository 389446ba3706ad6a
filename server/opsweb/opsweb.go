// Package opsweb serves the HTTP endpoints an operator points tools at:
// Prometheus metrics, Go profiles, /livez and /readyz, and (for a node)
// the live status page with the JSON it refreshes from.
//
// It only reads: nothing served here may change the cluster or the file
// tree, and no request may wait on the network (the page's data is
// gathered in the background), so the endpoints stay usable on a cluster
// under load.
package opsweb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Options says what a Handler serves.
type Options struct {
	// Registry is served at /metrics.
	Registry *prometheus.Registry
	// Ready, when set, answers /readyz: nil means ready, an error says
	// why not. Without it /readyz answers as /livez does.
	Ready func() error
	// Page, when set, serves the status page at / and its data under
	// /api/ (a node's handler has one; a mount's has none).
	Page http.Handler
}

// Handler serves the endpoints o names.
func Handler(o Options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry}))
	// Profiles of a running process (docs/benchmarks.md profiles real node
	// processes this way); the metrics address is an operator's port.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// A process that answers HTTP at all is alive: liveness must not
	// depend on the cluster, or an orchestrator would restart every node
	// of a cluster that merely lost its quorum.
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if o.Ready != nil {
			if err := o.Ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	if o.Page != nil {
		mux.Handle("/", o.Page)
	}
	return mux
}

// Serve listens on addr and serves h until ctx ends; it returns the bound
// address (addr may have port 0) once it is listening.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (net.Addr, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("operator http server", "addr", lis.Addr().String(), "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return lis.Addr(), nil
}

// Probe asks addr's endpoint path (such as /readyz) and returns nil when
// it answers 200 OK, else an error holding the status and the answer's
// first line (the reason a node gives for not being ready).
func Probe(ctx context.Context, addr, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return fmt.Errorf("%s%s: %s: %s", addr, path, resp.Status, line)
	}
	return nil
}
