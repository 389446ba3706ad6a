package workload

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/test/model"
)

// Seed returns the seed of a test run: $MEMFS_SEED when set (to replay a
// failure), otherwise a fresh one. It logs how to replay the run.
func Seed(t testing.TB) int64 {
	t.Helper()
	seed := time.Now().UnixNano() % 1_000_000_007
	if s := os.Getenv("MEMFS_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("MEMFS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay: MEMFS_SEED=%d go test -run '^%s$' ...)", seed, seed, t.Name())
	return seed
}

// Connect opens a client for the endpoint named name.
type Connect func(ctx context.Context, name string) (*client.Client, error)

// Run is one checked run: clients doing random operations while a
// nemesis hurts the cluster, then a final read of every key once the
// cluster is healed, then the linearizability check.
type Run struct {
	Clients          int
	WorkersPerClient int // workers sharing one client (and session); 1 when 0
	Workload         Config
	// Duration of the faulty phase (workers also stop at Workload.MaxOps).
	Duration time.Duration
	// Nemesis, when set, runs during the faulty phase (its T is the target).
	Nemesis *Nemesis
	// Caching, when set, adds caching readers (CachingReader) beside the
	// clients; they are named k0, k1... (a replacement of a killed k0:
	// k0.1...).
	Caching *Caching
}

// Outcome is what a Run did.
type Outcome struct {
	Verdict  model.Verdict
	Stats    *Stats
	Cache    *CacheStats // nil without caching readers
	Episodes []string
}

// Execute runs r against target and checks the history; it fails t on a
// violation, on a nemesis error, or when the healed cluster cannot serve the
// final reads.
func (r Run) Execute(t testing.TB, seed int64, target Target, connect Connect) Outcome {
	t.Helper()
	r.Workload.Seed = seed
	setupCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sc, err := connect(setupCtx, "setup")
	if err != nil {
		t.Fatalf("setup client: %v", err)
	}
	if err := Setup(setupCtx, sc, r.Workload); err != nil {
		t.Fatalf("setup: %v", err)
	}
	_ = sc.Close()

	rec, st := model.NewRecorder(), &Stats{}
	var workers []*Worker
	var names []string
	per := max(1, r.WorkersPerClient)
	for i := 0; i < r.Clients; i++ {
		name := fmt.Sprintf("c%d", i)
		c, err := connect(setupCtx, name)
		if err != nil {
			t.Fatalf("client %s: %v", name, err)
		}
		defer c.Close()
		names = append(names, name)
		for k := 0; k < per; k++ {
			workers = append(workers, NewWorker(len(workers), c, r.Workload, rec, st))
		}
	}

	ctx, stop := context.WithTimeout(context.Background(), r.Duration)
	defer stop()
	var cachers *cacherSet
	if r.Caching != nil && r.Caching.Readers > 0 {
		cachers = &cacherSet{cfg: *r.Caching, wl: r.Workload, net: target.Network(), rec: rec, st: st,
			cs: &CacheStats{}, logf: t.Logf, ctx: ctx, live: map[string]*cacher{}}
		cachers.nextID.Store(int64(len(workers)))
		defer cachers.close()
		for i := 0; i < r.Caching.Readers; i++ {
			if err := cachers.start(setupCtx, fmt.Sprintf("k%d", i)); err != nil {
				t.Fatalf("%v", err)
			}
		}
	}
	var wg sync.WaitGroup
	var nemErr error
	var nem *Nemesis
	if r.Nemesis != nil {
		nem = r.Nemesis
		nem.T, nem.Clients, nem.cachers = target, names, cachers
		if nem.Logf == nil {
			nem.Logf = t.Logf
		}
		wg.Add(1)
		go func() { defer wg.Done(); nemErr = nem.Run(ctx) }()
	}
	for _, w := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(ctx) }()
	}
	wg.Wait()
	out := Outcome{Stats: st}
	if cachers != nil {
		cachers.settle()
		out.Cache = cachers.cs
	}
	if nem != nil {
		out.Episodes = nem.Episodes()
	}
	if nemErr != nil {
		t.Fatalf("nemesis: %v", nemErr)
	}

	// Healed: every worker reads everything, with time to spare.
	final, cancel2 := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel2()
	var failedMu sync.Mutex
	var failed []string
	collect := func(f []string) {
		failedMu.Lock()
		failed = append(failed, f...)
		failedMu.Unlock()
	}
	for _, w := range workers {
		w.cfg.OpTimeout = 30 * time.Second
		wg.Add(1)
		go func() { defer wg.Done(); collect(w.ReadAll(final)) }()
	}
	if cachers != nil {
		wg.Add(1)
		go func() { defer wg.Done(); cachers.finalReads(final, 30*time.Second, collect) }()
	}
	wg.Wait()
	for _, f := range failed {
		t.Logf("final read failed: %s", f)
	}
	for _, w := range workers {
		w.WaitClosers()
	}
	if len(failed) > 0 {
		t.Errorf("the healed cluster failed %d of the final reads", len(failed))
	}
	t.Logf("workload: %v", st)
	if out.Cache != nil {
		t.Logf("%v", out.Cache)
	}
	if len(out.Episodes) > 0 {
		t.Logf("nemesis did %d episodes", len(out.Episodes))
	}
	out.Verdict = model.Check(t, seed, rec.Operations())
	if t.Failed() {
		for _, e := range out.Episodes {
			t.Logf("  episode: %s", e)
		}
	}
	return out
}
