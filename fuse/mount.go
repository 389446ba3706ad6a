// Package fuse mounts a MemoryFS cluster as a POSIX file system on this
// host with bazil.org/fuse, so that unmodified programs use it.
//
// The work is split in three layers:
//
//   - fuse/fsops: the inode operations, library independent, over the
//     client; the one place errors become errnos; the change watcher that
//     invalidates kernel caches;
//   - fuse/bazilfs: the thin bazil.org/fuse adapter;
//   - this package: mountpoint checks (refusing a file or an existing
//     mount, clearing a stale one), mount options, serving, unmounting.
//
// # Kernel caching
//
// Attributes and entries are cached for Options.AttrTimeout (1 s), file
// data in the page cache. The cluster's change stream invalidates both
// when another mount or client changes something, so changes are seen
// well before the timeouts. The kernel writeback cache is off unless asked
// for (see Options.WritebackCache).
//
// This package must never import the server or the state machine.
package fuse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	bfuse "bazil.org/fuse"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/fuse/bazilfs"
	"github.com/memoryfs/memfs/fuse/fsops"
	"github.com/memoryfs/memfs/fuse/gofusefs"
	"github.com/memoryfs/memfs/fuse/mountmetrics"
)

// The FUSE bindings a mount can be served with (Options.Binding).
const (
	BindingBazil  = "bazil"  // bazil.org/fuse (fuse/bazilfs)
	BindingGoFuse = "gofuse" // github.com/hanwen/go-fuse/v2 (fuse/gofusefs), the default

	// Options.Atime: how reads move access times.
	AtimeNo       = "noatime"  // never (the default): no command per first read
	AtimeRelative = "relatime" // the first read after a change (fsops/atime.go)
)

// Defaults of Options.
const (
	DefaultAttrTimeout  = time.Second
	DefaultReadaheadKiB = 1024
	// DefaultDataCache is how much file data a mount keeps to answer
	// later reads (fsops.Options.DataCache).
	DefaultDataCache = 256 << 20
	// MaxIO is the largest read or write the kernel sends in one request
	// through bazil.org/fuse.
	MaxIO = bazilfs.MaxIO
)

// Options control one mount.
type Options struct {
	// AttrTimeout is how long the kernel caches attributes and names
	// (DefaultAttrTimeout when 0).
	AttrTimeout time.Duration
	// OpTimeout is how long an operation waits for the cluster before it
	// fails with EIO (fsops.DefaultOpTimeout when 0).
	OpTimeout time.Duration
	// AllowOther lets users other than the one mounting use the mount
	// (needs user_allow_other in /etc/fuse.conf unless root).
	AllowOther bool
	// WritebackCache turns on the kernel's writeback cache: faster
	// small writes, but O_APPEND is then placed by this kernel, so appends
	// from two mounts may overwrite each other.
	WritebackCache bool
	// LocalLocks leaves fcntl and flock locks to this host's kernel, as
	// a local file system has them: they then exclude processes of this
	// host only. Without it they are held in the cluster and exclude
	// processes on every mount (docs/fuse.md, "Locks").
	LocalLocks bool
	// ForceUnmount detaches a live FUSE mount found on the mountpoint
	// instead of refusing it. A stale one is always cleared.
	ForceUnmount bool
	// ReadaheadKiB, when positive, raises the kernel's readahead window
	// for the mount above the 128 KiB FUSE starts with (needs root;
	// DefaultReadaheadKiB when 0, none when negative).
	ReadaheadKiB int
	// DataCache is how many bytes of file data the mount keeps in its own
	// memory to answer later reads, through any handle, while the change
	// stream is open (DefaultDataCache when 0; none beyond readahead when
	// negative).
	DataCache int64
	// NoWatch leaves the change stream unread (for measurements): other
	// mounts' changes are then seen only when the timeouts run out.
	NoWatch bool
	// Binding is the FUSE library serving the mount: BindingGoFuse (when
	// empty) or BindingBazil. go-fuse is the default: with READDIRPLUS
	// and negative entries in the kernel, `ls -lR` under capabilities
	// runs at 1.75x a local passthrough where bazil takes 4.4x
	// (docs/benchmarks.md, "Real programs through the mount").
	Binding string
	// Atime is AtimeNo (when empty) or AtimeRelative. Under relatime the
	// first read of a file after a change moves its atime, at the cost
	// of one replicated command in the background per such read; the
	// default, as JuiceFS's, moves it only when set explicitly.
	Atime string
	// Sync commits every metadata change before answering it. Without it
	// (and with capabilities), changes in directories the mount holds
	// exclusively are answered at once and committed in ordered batches,
	// at the latest by fsync, unmount or a recall (docs/fuse.md,
	// "Buffered metadata").
	Sync bool
	// Journal bounds those batches (client.JournalOptions defaults).
	Journal client.JournalOptions
	// FSName is the source shown in the mount table ("memfs" when empty).
	FSName string
	// Debug, if set, receives a trace line for every FUSE request and
	// reply.
	Debug func(msg any)
	// Metrics, if set, receives the mount's metrics (fuse/mountmetrics):
	// every operation is then timed and counted.
	Metrics prometheus.Registerer
}

// binding is one FUSE library serving a mount.
type binding interface {
	fsops.Invalidator
	// serve answers the kernel until the mount is gone.
	serve() error
	// ready returns once the kernel has initialised the mount (serve
	// must be running).
	ready() error
	// close releases what serving held once it has stopped.
	close() error
}

// MountPoint is a mounted cluster.
type MountPoint struct {
	dir       string
	srv       binding
	ops       *fsops.ClientOps
	stopWatch context.CancelFunc
	done      chan struct{}
	serveErr  error // set before done is closed
	unmount   sync.Once
	unmountEr error
}

// Mount mounts the cluster c serves on dir and serves it until it is
// unmounted. It returns once the mount is ready for use. The caller keeps
// ownership of c and must close it only after the mount is gone.
func Mount(ctx context.Context, c *client.Client, dir string, opt Options) (*MountPoint, error) {
	if err := CheckBinding(opt.Binding); err != nil {
		return nil, fmt.Errorf("mount %s: FUSE binding %w", dir, err)
	}
	if err := CheckAtime(opt.Atime); err != nil {
		return nil, fmt.Errorf("mount %s: atime %w", dir, err)
	}
	if err := Available(); err != nil {
		return nil, err
	}
	real, err := PrepareMountpoint(ctx, dir, opt.ForceUnmount)
	if err != nil {
		return nil, err
	}
	if opt.AttrTimeout <= 0 {
		opt.AttrTimeout = DefaultAttrTimeout
	}
	switch {
	case opt.DataCache == 0:
		opt.DataCache = DefaultDataCache
	case opt.DataCache < 0:
		opt.DataCache = 0
	}
	ops := fsops.New(c, fsops.Options{OpTimeout: opt.OpTimeout, WritebackCache: opt.WritebackCache, DataCache: opt.DataCache,
		Relatime: opt.Atime == AtimeRelative, Buffered: !opt.Sync, Journal: opt.Journal,
		KernelChecksData: opt.Binding != BindingBazil})
	var observe fsops.Observer
	if opt.Metrics != nil {
		mm := mountmetrics.New(ops.Stats)
		if err := opt.Metrics.Register(mm); err != nil {
			return nil, fmt.Errorf("mount metrics: %w", err)
		}
		observe = mm.Observe
	}
	served := fsops.Wrap(ops, observe)
	srv, err := mountBinding(real, ops, served, opt)
	if err != nil {
		return nil, err
	}
	m := &MountPoint{dir: real, srv: srv, ops: ops, done: make(chan struct{})}
	wctx, stop := context.WithCancel(context.Background())
	m.stopWatch = stop
	if !opt.NoWatch {
		go ops.Watch(wctx, srv)
	}
	go func() {
		m.serveErr = srv.serve()
		close(m.done)
	}()
	if err := srv.ready(); err != nil {
		_ = fusermountUnmount(ctx, real, true)
		stop()
		return nil, fmt.Errorf("mount %s: %w", real, err)
	}
	if opt.ReadaheadKiB >= 0 {
		setReadahead(real, cmp(opt.ReadaheadKiB, DefaultReadaheadKiB))
	}
	return m, nil
}

func cmp(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// CheckBinding returns an error unless name is a binding Mount can serve
// with ("" is the default, bazil).
func CheckBinding(name string) error {
	switch name {
	case "", BindingBazil, BindingGoFuse:
		return nil
	}
	return fmt.Errorf("%q: want %s or %s", name, BindingBazil, BindingGoFuse)
}

// CheckAtime reports whether name is an atime mode Mount knows.
func CheckAtime(name string) error {
	switch name {
	case "", AtimeNo, AtimeRelative:
		return nil
	}
	return fmt.Errorf("%q: want %s or %s", name, AtimeNo, AtimeRelative)
}

// covered is the kernel timeout of answers that do not say, with
// capabilities (nil without: the attribute timeout).
func covered(ops *fsops.ClientOps) func(fsops.Attr) time.Duration {
	if ops.Capabilities() {
		return ops.KernelTimeout
	}
	return nil
}

// mountBinding mounts dir with the binding opt names (checked by Mount).
// mountBinding serves served (ops itself, or ops measured) on dir.
func mountBinding(dir string, ops *fsops.ClientOps, served fsops.Ops, opt Options) (binding, error) {
	if opt.Binding == BindingGoFuse || opt.Binding == "" {
		gfs, err := gofusefs.Mount(dir, served, gofusefs.Config{
			AttrTimeout: opt.AttrTimeout, Covered: covered(ops), Watching: ops.Watching,
			FSName: fsName(opt), AllowOther: opt.AllowOther, WritebackCache: opt.WritebackCache,
			LocalLocks:   opt.LocalLocks,
			MaxReadahead: maxReadahead, MaxBackground: maxBackground, Congestion: congestion,
			Debug: opt.Debug != nil,
		})
		if err != nil {
			return nil, fmt.Errorf("mount %s: %w", dir, err)
		}
		return &gofuseServer{gfs}, nil
	}
	bfs := bazilfs.New(served, bazilfs.Config{AttrTimeout: opt.AttrTimeout, EntryTimeout: opt.AttrTimeout, Covered: covered(ops), Debug: opt.Debug})
	conn, err := bfuse.Mount(dir, mountOptions(opt)...)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	return &bazilServer{bfs, conn}, nil
}

type bazilServer struct {
	*bazilfs.FS
	conn *bfuse.Conn
}

func (b *bazilServer) serve() error { return b.Serve(b.conn) }
func (b *bazilServer) ready() error { return nil } // bfuse.Mount waited for INIT
func (b *bazilServer) close() error { return b.conn.Close() }

// gofuseServer serves with go-fuse, which closes its device itself when
// serving ends.
type gofuseServer struct{ *gofusefs.FS }

func (g *gofuseServer) serve() error { g.Serve(); return nil }
func (g *gofuseServer) ready() error { return g.WaitMount() }
func (g *gofuseServer) close() error { return nil }

// Kernel queue settings shared by both bindings.
const (
	maxReadahead  = 1 << 20
	maxBackground = 64
	congestion    = 48
)

func fsName(opt Options) string {
	if opt.FSName == "" {
		return "memfs"
	}
	return opt.FSName
}

// mountOptions are bazil's kernel mount options for opt.
func mountOptions(opt Options) []bfuse.MountOption {
	o := []bfuse.MountOption{
		bfuse.FSName(fsName(opt)),
		bfuse.Subtype("memfs"),
		// The kernel checks modes itself against the attributes.
		bfuse.DefaultPermissions(),
		// Several reads of one file in flight at once (readahead).
		bfuse.AsyncRead(),
		// The kernel takes the smaller of this and its own default;
		// setReadahead raises the latter.
		bfuse.MaxReadahead(maxReadahead),
		bfuse.MaxBackground(maxBackground),
		bfuse.CongestionThreshold(congestion),
	}
	if opt.AllowOther {
		o = append(o, bfuse.AllowOther())
	}
	if opt.WritebackCache {
		o = append(o, bfuse.WritebackCache())
	}
	if !opt.LocalLocks {
		o = append(o, bfuse.LockingPOSIX(), bfuse.LockingFlock())
	}
	return o
}

// setReadahead sets the readahead window of the mount's backing device
// info (/sys/class/bdi/0:N/read_ahead_kb). It is best effort: without root
// the kernel's default stays.
func setReadahead(dir string, kib int) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return
	}
	major, minor := (st.Dev>>8)&0xfff, (st.Dev&0xff)|((st.Dev>>12)&0xfff00)
	p := filepath.Join("/sys/class/bdi", fmt.Sprintf("%d:%d", major, minor), "read_ahead_kb")
	if err := os.WriteFile(p, []byte(strconv.Itoa(kib)), 0o644); err != nil {
		slog.Debug("fuse: could not raise readahead", "path", p, "err", err)
	}
}

// Dir is the absolute path the cluster is mounted on.
func (m *MountPoint) Dir() string { return m.dir }

// Done is closed when the mount is gone (unmounted here or elsewhere).
func (m *MountPoint) Done() <-chan struct{} { return m.done }

// Err is why serving stopped, once Done is closed (nil after an unmount).
func (m *MountPoint) Err() error {
	select {
	case <-m.done:
		return m.serveErr
	default:
		return nil
	}
}

// unmountRetry paces unmount attempts while the mount is busy.
const unmountRetry = 100 * time.Millisecond

// Unmount unmounts the file system and waits until serving has stopped.
// While the mount is busy (a process has a file open or its working
// directory in it) it retries until ctx ends, then detaches it lazily: the
// kernel removes it once the last user leaves.
func (m *MountPoint) Unmount(ctx context.Context) error {
	m.unmount.Do(func() { m.unmountEr = m.doUnmount(ctx) })
	return m.unmountEr
}

func (m *MountPoint) doUnmount(ctx context.Context) error {
	defer m.stopWatch()
	for {
		select {
		case <-m.done:
			return m.closeConn()
		default:
		}
		err := fusermountUnmount(context.WithoutCancel(ctx), m.dir, false)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			slog.Warn("fuse: mount still busy; detaching it lazily", "dir", m.dir, "err", err)
			if lerr := fusermountUnmount(context.WithoutCancel(ctx), m.dir, true); lerr != nil {
				return errors.Join(err, lerr)
			}
			break
		}
		t := time.NewTimer(unmountRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		case <-m.done:
			t.Stop()
		}
	}
	// The kernel ends the connection at unmount; serving stops soon
	// after. A lazy unmount of a busy mount ends it only when the last
	// user leaves, so this does not wait on ctx.
	select {
	case <-m.done:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("unmount %s: still serving 5 s after unmount (lazily detached and busy?)", m.dir)
	}
	return m.closeConn()
}

func (m *MountPoint) closeConn() error {
	err := m.srv.close()
	if m.serveErr != nil {
		return errors.Join(m.serveErr, err)
	}
	return err
}
