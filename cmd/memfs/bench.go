package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
)

// byteSize is a flag value like 256MiB, 4KiB, 1GiB, 1MB or 4096.
type byteSize int64

// Set parses s with parseSize (server.go), the syntax of every size flag.
func (b *byteSize) Set(s string) error {
	n, err := parseSize(s)
	if err == nil && n > 1<<50 {
		err = fmt.Errorf("size %q is too large", s)
	}
	*b = byteSize(n)
	return err
}

func (b *byteSize) String() string { return formatBytes(int64(*b)) }
func (b *byteSize) Type() string   { return "size" }

func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.suffix)
		}
		if n >= u.mult {
			return fmt.Sprintf("%.1f%s", float64(n)/float64(u.mult), u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}

type benchOptions struct {
	json        bool
	total, size byteSize
	concurrency int
	creates     int
	clients     int
	fileSize    byteSize
	phases      string
	keep        bool
}

func newBenchCmd() *cobra.Command {
	o := &benchOptions{total: 256 << 20, size: 1 << 20, concurrency: 16, creates: 10000, clients: 32, fileSize: 4 << 10,
		phases: "write,read,create"}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure write and read throughput and file creates against a cluster",
		Long: `Measure the cluster: sequential write, then read, of --total bytes in
operations of --size (default 1 MiB) with --concurrency operations in flight
on one file; then --creates files of --file-size (default 4 KiB) written by
--clients concurrent clients, each with its own session. Reports throughput
(MB = 10^6 bytes) and p50/p99 latency of the operations of each phase.
Everything it creates is under /.bench-* and is removed at the end.
--timeout bounds each operation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return runBench(cmd, args, o) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.json, "json", false, "print one JSON object")
	f.Var(&o.total, "total", "bytes to write and read in the throughput phases")
	f.Var(&o.size, "size", "bytes per write or read operation")
	f.IntVar(&o.concurrency, "concurrency", o.concurrency, "operations in flight in the throughput phases")
	f.IntVar(&o.creates, "creates", o.creates, "files to create in the create phase")
	f.IntVar(&o.clients, "clients", o.clients, "concurrent clients (sessions) in the create phase")
	f.Var(&o.fileSize, "file-size", "size of each created file")
	f.StringVar(&o.phases, "phases", o.phases, "phases to run: write, read (needs write), create")
	f.BoolVar(&o.keep, "keep", false, "keep the files the benchmark made")
	return cmd
}

// phaseResult is one phase of the report; the JSON names are stable.
type phaseResult struct {
	Phase     string  `json:"phase"`
	Ops       int     `json:"ops"`
	OpBytes   int64   `json:"op_bytes"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MBPerSec  float64 `json:"mb_per_s"`
	OpsPerSec float64 `json:"ops_per_s"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	Workers   int     `json:"workers"`
}

type benchReport struct {
	Cluster []string      `json:"cluster"`
	Leader  string        `json:"leader"`
	Phases  []phaseResult `json:"phases"`
}

func runBench(cmd *cobra.Command, _ []string, o *benchOptions) error {
	if err := o.checkBenchFlags(); err != nil {
		return usageError{err}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := o.measure(ctx, cmd)
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printBench(cmd.OutOrStdout(), rep)
}

// measure runs the phases the bench settings name in a new directory,
// which it removes unless --keep (memfs bench and memfs check perf).
func (o *benchOptions) measure(ctx context.Context, cmd *cobra.Command) (benchReport, error) {
	setup, cancel := context.WithTimeout(ctx, global.timeout)
	cmd.SetContext(setup)
	c, err := newClient(cmd)
	cancel()
	if err != nil {
		return benchReport{}, err
	}
	defer c.Close()
	c = c.WithContext(ctx)
	st, err := c.Status(ctx)
	if err != nil {
		return benchReport{}, err
	}
	dir := fmt.Sprintf("/.bench-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if err := c.Mkdir(dir, 0o755); err != nil {
		return benchReport{}, err
	}
	rep := benchReport{Cluster: clusterAddrs(), Leader: st.Leader}
	err = o.runPhases(ctx, cmd, c, dir, &rep)
	if !o.keep {
		if cerr := cleanup(ctx, c, dir); err == nil {
			err = cerr
		}
	}
	return rep, err
}

func (o *benchOptions) checkBenchFlags() error {
	switch {
	case o.size <= 0 || o.total < o.size:
		return errors.New("--size must be positive and at most --total")
	case o.concurrency < 1 || o.clients < 1 || o.creates < 0:
		return errors.New("--concurrency and --clients must be at least 1")
	}
	for _, p := range strings.Split(o.phases, ",") {
		if !slices.Contains([]string{"write", "read", "create"}, strings.TrimSpace(p)) {
			return fmt.Errorf("unknown phase %q", p)
		}
	}
	if o.phase("read") && !o.phase("write") {
		return errors.New("the read phase reads what the write phase wrote")
	}
	return nil
}

func (o *benchOptions) phase(name string) bool {
	for _, p := range strings.Split(o.phases, ",") {
		if strings.TrimSpace(p) == name {
			return true
		}
	}
	return false
}

func (o *benchOptions) runPhases(ctx context.Context, cmd *cobra.Command, c *client.Client, dir string, rep *benchReport) error {
	if o.phase("write") {
		w, r, err := o.throughput(ctx, c, dir+"/seq")
		if err != nil {
			return err
		}
		rep.Phases = append(rep.Phases, w)
		if o.phase("read") {
			rep.Phases = append(rep.Phases, r)
		}
	}
	if o.phase("create") && o.creates > 0 {
		res, err := o.createPhase(ctx, cmd, dir)
		if err != nil {
			return err
		}
		rep.Phases = append(rep.Phases, res)
	}
	return nil
}

// throughput writes --total bytes to name in --size operations, then reads
// them back, with --concurrency operations in flight.
func (o *benchOptions) throughput(ctx context.Context, c *client.Client, name string) (phaseResult, phaseResult, error) {
	size := int(o.size)
	ops := int(int64(o.total) / int64(o.size))
	f, err := c.Create(name)
	if err != nil {
		return phaseResult{}, phaseResult{}, err
	}
	defer f.Close()
	// Random data, a different window of it per operation, so that block
	// dedup cannot skip any of the work.
	src := make([]byte, 2*size)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(src)
	window := func(i int) []byte { o := (i * 4099) % size; return src[o : o+size] }

	w, err := runOps(ctx, "write", ops, o.concurrency, int64(size), func(ctx context.Context, i, _ int) error {
		_, err := f.WriteAt(window(i), int64(i)*int64(size))
		return err
	})
	if err != nil || !o.phase("read") {
		return w, phaseResult{}, err
	}
	bufs := make([][]byte, o.concurrency)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	r, err := runOps(ctx, "read", ops, o.concurrency, int64(size), func(ctx context.Context, i, worker int) error {
		n, err := f.ReadAt(bufs[worker], int64(i)*int64(size))
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if n != size {
			return fmt.Errorf("read %d of %d bytes at op %d", n, size, i)
		}
		return nil
	})
	return w, r, err
}

// creates writes --creates files of --file-size with --clients clients,
// each with its own session and directory.
func (o *benchOptions) createPhase(ctx context.Context, cmd *cobra.Command, dir string) (phaseResult, error) {
	clients := make([]*client.Client, o.clients)
	defer func() {
		for _, c := range clients {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	for i := range clients {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, global.timeout)
			defer cancel()
			sub := *cmd
			sub.SetContext(sctx)
			c, err := newClient(&sub)
			if err == nil {
				clients[i] = c.WithContext(ctx)
				err = clients[i].Mkdir(fmt.Sprintf("%s/c%d", dir, i), 0o755)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return phaseResult{}, err
	}
	body := make([]byte, o.fileSize)
	for i := range body {
		body[i] = byte(i)
	}
	return runOps(ctx, "create", o.creates, o.clients, int64(o.fileSize), func(_ context.Context, i, worker int) error {
		// Each file differs in its first bytes, like real small files.
		data := slices.Clone(body)
		copy(data, strconv.Itoa(i))
		return clients[worker].WriteFile(fmt.Sprintf("%s/c%d/f%d", dir, worker, i), data, 0o644)
	})
}

// runOps runs ops operations on workers goroutines (op i is handed to the
// next free worker in order) and measures each.
func runOps(ctx context.Context, name string, ops, workers int, opBytes int64, op func(ctx context.Context, i, worker int) error) (phaseResult, error) {
	lat := make([]time.Duration, ops)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= ops || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				err := op(ctx, i, w)
				lat[i] = time.Since(t0)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s phase: %w", name, err)
					}
					mu.Unlock()
					next.Store(int64(ops))
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return phaseResult{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return phaseResult{}, err
	}
	slices.Sort(lat)
	secs := elapsed.Seconds()
	return phaseResult{
		Phase: name, Ops: ops, OpBytes: opBytes, Bytes: int64(ops) * opBytes, Seconds: secs,
		MBPerSec: float64(int64(ops)*opBytes) / 1e6 / secs, OpsPerSec: float64(ops) / secs,
		P50Ms: ms(percentile(lat, 0.50)), P99Ms: ms(percentile(lat, 0.99)), Workers: workers,
	}, nil
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cleanup removes the benchmark's tree, each create directory by its own
// goroutine so that it takes seconds, not minutes.
func cleanup(ctx context.Context, c *client.Client, dir string) error {
	ents, err := c.ReadDir(dir)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ents))
	sem := make(chan struct{}, 16)
	for i, e := range ents {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = c.WithContext(ctx).RemoveAll(path.Join(dir, e.Name()))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return c.Remove(dir)
}

func printBench(out io.Writer, rep benchReport) error {
	fmt.Fprintf(out, "memfs bench against %s (leader %s)\n\n", strings.Join(rep.Cluster, ","), rep.Leader)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tops\top size\tin flight\ttime\tthroughput\tp50\tp99")
	for _, p := range rep.Phases {
		rate := fmt.Sprintf("%.1f MB/s", p.MBPerSec)
		if p.Phase == "create" {
			rate = fmt.Sprintf("%.0f files/s", p.OpsPerSec)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.2fs\t%s\t%.1fms\t%.1fms\n", p.Phase, p.Ops, formatBytes(p.OpBytes),
			p.Workers, p.Seconds, rate, p.P50Ms, p.P99Ms)
	}
	return tw.Flush()
}
