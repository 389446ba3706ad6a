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
	starts  sync.WaitGroup // replacements being connected
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

// start connects reader name and runs it until ctx ends or it is killed.
func (s *cacherSet) start(connectCtx context.Context, name string) error {
	k := &cacher{}
	var dial client.Dialer
	dial, k.kill = Killable(s.cfg.Dialer(name))
	c, err := s.cfg.Connect(connectCtx, name, CachingOptions(s.cfg.Lease, dial)...)
	if err != nil {
		return fmt.Errorf("caching reader %s: %w", name, err)
	}
	n := max(1, s.cfg.Workers)
	k.c = c
	k.rs = NewCachingReaders(int(s.nextID.Add(int64(n))-int64(n)), n, name, c, s.wl, s.rec, s.st, s.cs)
	for _, r := range k.rs {
		r.Writes = s.cfg.Writes
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		// The phase ended while it connected: nothing to run.
		s.closeLater(c)
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
	}
	k.stop()
	s.closeLater(k.c)
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

func (s *cacherSet) closeLater(c *client.Client) {
	s.closers.Add(1)
	go func() { defer s.closers.Done(); _ = c.Close() }()
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

// readers returns the live readers.
func (s *cacherSet) readers() []*CachingReader {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*CachingReader
	for _, n := range s.order {
		if k := s.live[n]; k != nil {
			out = append(out, k.rs...)
		}
	}
	return out
}

// close closes every client and waits for all closes.
func (s *cacherSet) close() {
	s.mu.Lock()
	for _, k := range s.live {
		s.closeLater(k.c)
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
