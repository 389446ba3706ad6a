package workload

import (
	"context"
	"errors"
	"fmt"
	randv2 "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/test/faultnet"
	"github.com/memoryfs/memfs/test/model"
)

// Caching configures the caching readers of a Run.
type Caching struct {
	// Readers is how many caching clients run, each with Workers
	// concurrent readers (1 when 0) through one fsops.ClientOps.
	Readers, Workers int
	// Writes is the share of the readers' operations that change things
	// through the mount (CachingReader.Writes).
	Writes float64
	// Buffered is how many of the caching clients (k0, k1...: the first
	// ones, and their replacements) mount with buffered metadata
	// (NewBufferingReaders), their journals bounded by Journal, their
	// readers' share of changes BufferedWrites (Writes when 0).
	Buffered       int
	Journal        client.JournalOptions
	BufferedWrites float64
	// Lease is the readers' session lease: how long a frozen or dead
	// reader can hold up another session's command, and so how long a
	// freeze must last for its capabilities to be revoked.
	Lease time.Duration
	// Connect opens a client named name with opts (which override the
	// cluster's defaults, its dialer included).
	Connect func(ctx context.Context, name string, opts ...client.Option) (*client.Client, error)
	// Dialer is the cluster's dialer for the endpoint name.
	Dialer func(name string) client.Dialer
}

// errKilled fails every dial of a killed reader.
var errKilled = errors.New("workload: caching reader killed")

// cacher is one running caching reader.
type cacher struct {
	c    *client.Client
	rs   []*CachingReader
	conf *confirmer // a buffering client's, else nil
	stop context.CancelFunc
	done sync.WaitGroup // its Run and Watch
	kill func()
}

// cacherSet runs a history's caching readers, kills them for the nemesis
// and starts their replacements.
type cacherSet struct {
	cfg    Caching
	wl     Config
	net    *faultnet.Net
	rec    *model.Recorder
	st     *Stats
	cs     *CacheStats
	nextID atomic.Int64 // porcupine ids of readers
	gen    atomic.Int64 // replacement names
	logf   func(format string, args ...any)

	mu      sync.Mutex
	ctx     context.Context // the faulty phase; guarded by mu
	live    map[string]*cacher
	order   []string
	all     []*cacher
	starts  sync.WaitGroup // replacements being connected, buffering clients being unmounted
	closers sync.WaitGroup // clients being closed
}

// Killable wraps dial so that, once kill is called, every dial fails: with
// its connections reset (faultnet.Net.ResetConns), a client then never
// reaches the cluster again, as if its process had died, and its Close
// cannot end its session.
func Killable(dial client.Dialer) (d client.Dialer, kill func()) {
	var killed atomic.Bool
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if killed.Load() {
			return nil, errKilled
		}
		return dial(ctx, addr)
	}, func() { killed.Store(true) }
}

// CachingOptions are the options of a caching reader's client: it holds
// capabilities, on a session of lease, and dials through dial.
func CachingOptions(lease time.Duration, dial client.Dialer) []client.Option {
	return []client.Option{client.WithCaps(), client.WithLease(lease),
		client.WithAttemptTimeout(time.Second), client.WithDialer(dial)}
}

// BufferingOptions are CachingOptions for a buffering client. Its journal
// sends each batch for at most 4 leases (the mount's default is 30 s): a
// batch that runs out is lost (its answers voided, which is sound), and
// the journal of a dead client gives up on its last batch that much
// sooner, which is what bounds how long a killed client's readers and
// close take.
func BufferingOptions(lease time.Duration, dial client.Dialer) []client.Option {
	return append(CachingOptions(lease, dial), client.WithRetryTimeout(4*lease))
}

// start connects reader name and runs it until ctx ends or it is killed.
func (s *cacherSet) start(connectCtx context.Context, name string) error {
	k := &cacher{}
	var dial client.Dialer
	dial, k.kill = Killable(s.cfg.Dialer(name))
	buffered := s.buffered(name)
	opts := CachingOptions(s.cfg.Lease, dial)
	if buffered {
		opts = BufferingOptions(s.cfg.Lease, dial)
	}
	c, err := s.cfg.Connect(connectCtx, name, opts...)
	if err != nil {
		return fmt.Errorf("caching reader %s: %w", name, err)
	}
	n := max(1, s.cfg.Workers)
	k.c = c
	first := int(s.nextID.Add(int64(n)) - int64(n))
	if buffered {
		k.rs = NewBufferingReaders(first, n, name, c, s.cfg.Journal, s.wl, s.rec, s.st, s.cs)
		k.conf = k.rs[0].conf
	} else {
		k.rs = NewCachingReaders(first, n, name, c, s.wl, s.rec, s.st, s.cs)
	}
	for _, r := range k.rs {
		r.Writes = s.cfg.Writes
		if buffered && s.cfg.BufferedWrites > 0 {
			r.Writes = s.cfg.BufferedWrites
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		// The phase ended while it connected: nothing to run.
		s.closeLater(k)
		return nil
	}
	ctx, stop := context.WithCancel(s.ctx)
	k.stop = stop
	k.done.Add(1 + n)
	go func() { defer k.done.Done(); k.rs[0].Watch(ctx) }()
	for _, r := range k.rs {
		go func() { defer k.done.Done(); r.Run(ctx) }()
	}
	s.live[name] = k
	s.order = append(s.order, name)
	s.all = append(s.all, k)
	return nil
}

// buffered reports whether caching client name (k0, or a replacement
// k0.1, k0.1.2...) buffers: the first cfg.Buffered of them do.
func (s *cacherSet) buffered(name string) bool {
	var i int
	if _, err := fmt.Sscanf(name, "k%d", &i); err != nil {
		return false
	}
	return i < s.cfg.Buffered
}

// names lists the live readers.
func (s *cacherSet) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, n := range s.order {
		if s.live[n] != nil {
			out = append(out, n)
		}
	}
	return out
}

// kill stops reader name while it holds whatever capabilities it holds,
// and starts a replacement. Graceful is Close (its session ends, and its
// capabilities with it); otherwise it dies as a crashed process does: its
// connections are reset, it never reaches the cluster again, and the
// cluster takes its capabilities back a lease after a recall or when its
// session expires.
func (s *cacherSet) kill(name string, graceful bool) {
	s.mu.Lock()
	k := s.live[name]
	delete(s.live, name)
	s.mu.Unlock()
	if k == nil {
		return
	}
	s.cs.Kills.Add(1)
	if !graceful {
		k.kill()
		s.net.ResetConns(name)
		if k.conf != nil {
			// Whatever it answered and did not sync may be lost.
			k.conf.kill()
		}
	}
	k.stop()
	if graceful && k.conf != nil {
		// An unmount: the journal is synced before the session ends,
		// which confirms what it answered. The history waits for it
		// (settle), since the answers it settles are in no history yet.
		s.starts.Add(1)
		go func() {
			defer s.starts.Done()
			k.done.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), 4*s.cfg.Lease)
			defer cancel()
			_ = k.conf.finish(ctx)
			s.closeLater(k)
		}()
	} else {
		s.closeLater(k)
	}
	// The replacement connects in the background: the cluster may be
	// partitioned now, and the nemesis must not wait for it.
	repl := fmt.Sprintf("%s.%d", name, s.gen.Add(1))
	s.starts.Add(1)
	go func() {
		defer s.starts.Done()
		s.mu.Lock()
		ctx := s.ctx
		s.mu.Unlock()
		if err := s.start(ctx, repl); err != nil && ctx.Err() == nil && s.logf != nil {
			s.logf("replacing caching reader %s: %v", name, err)
		}
	}()
}

// closeLater closes k's client in the background: first its journal,
// which a killed client's readers may still be waiting on (a dead client
// gives up on its last batch after its retry timeout), so that the
// journal's goroutine ends and its session's close does not sync.
func (s *cacherSet) closeLater(k *cacher) {
	s.closers.Add(1)
	go func() {
		defer s.closers.Done()
		if k.conf != nil {
			k.conf.kill() // no-op unless nothing settled it
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // nothing more is synced: only the goroutine is stopped
			_ = k.conf.jr.Close(ctx)
		}
		_ = k.c.Close()
	}()
}

// settle waits for the readers of the faulty phase to stop and for the
// replacements started during it.
func (s *cacherSet) settle() {
	s.starts.Wait()
	s.mu.Lock()
	all := append([]*cacher(nil), s.all...)
	s.mu.Unlock()
	for _, k := range all {
		k.done.Wait()
	}
}

// finalReads has every live reader read every key (ReadAll), collecting
// the reads that failed. A buffering client first syncs what it answered
// during the faulty phase, and after its reads settles everything (its
// answers so far would otherwise be in no history).
func (s *cacherSet) finalReads(ctx context.Context, timeout time.Duration, collect func([]string)) {
	s.mu.Lock()
	var live []*cacher
	for _, n := range s.order {
		if k := s.live[n]; k != nil {
			live = append(live, k)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, k := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range k.rs {
				r.cfg.OpTimeout = timeout
			}
			if k.conf != nil {
				_ = k.rs[0].Sync(ctx)
			}
			var rw sync.WaitGroup
			for _, r := range k.rs {
				rw.Add(1)
				go func() { defer rw.Done(); collect(r.ReadAll(ctx)) }()
			}
			rw.Wait()
			if k.conf != nil {
				sctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				_ = k.conf.finish(sctx)
			}
		}()
	}
	wg.Wait()
}

// close closes every client and waits for all closes.
func (s *cacherSet) close() {
	s.mu.Lock()
	for _, k := range s.live {
		s.closeLater(k)
	}
	s.live = map[string]*cacher{}
	s.mu.Unlock()
	s.closers.Wait()
}

// SoakCachers draws how many caching clients a soak cluster of seed runs:
// none half the time, else 1 or 2 (with all, 1 or 2 always). It has its
// own generator: math/rand's first draws for consecutive seeds are
// correlated (the process soak's second draw was 0 for 27 of 30 seeds).
func SoakCachers(seed int64, all bool) int {
	r := randv2.New(randv2.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	if all {
		return 1 + r.IntN(2)
	}
	return max(0, r.IntN(4)-1)
}

// SoakBuffered draws how many of the cachers caching clients of a soak
// cluster buffer (with MEMFS_SOAK_BUFFERED=on): one or all of them, half
// the time each, from its own generator (see SoakCachers).
func SoakBuffered(seed int64, cachers int) int {
	r := randv2.New(randv2.NewPCG(uint64(seed), 0xb5ad4eceda1ce2a9))
	if cachers <= 1 || r.IntN(2) == 0 {
		return min(1, cachers)
	}
	return cachers
}
