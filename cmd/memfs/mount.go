package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/fuse"
	"github.com/memoryfs/memfs/internal/heapgoal"
	"github.com/memoryfs/memfs/server/opsweb"
)

type mountOptions struct {
	daemon           bool
	allowOther       bool
	writeback        bool
	localLocks       bool
	force            bool
	noWatch          bool
	attrTimeout      time.Duration
	opTimeout        time.Duration
	readaheadKiB     int
	dataCache        byteSize
	logFile          string
	debug, hugePages bool
	cpuProfile       string
	binding          string
	atime            string
	caps             bool
	sync             bool
	lease            time.Duration
	metricsAddr      string
}

func newMountCmd() *cobra.Command {
	o := &mountOptions{}
	cmd := &cobra.Command{
		Use:   "mount MOUNTPOINT",
		Short: "Mount the cluster as a POSIX file system (FUSE)",
		Long: `Mount the cluster on MOUNTPOINT through FUSE so that unmodified programs
use it. Runs in the foreground until the file system is unmounted
("fusermount3 -u MOUNTPOINT") or the process gets SIGINT/SIGTERM, then
unmounts cleanly; --daemon detaches and returns once the mount is ready.

A mountpoint left behind by a killed mount process is cleared first. A
live mount on MOUNTPOINT is refused unless --force-unmount is given.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runMount(cmd, args, o) },
	}
	f := cmd.Flags()
	f.BoolVar(&o.daemon, "daemon", false, "detach and return once the mount is ready")
	f.BoolVar(&o.allowOther, "allow-other", false, "let other users use the mount (needs user_allow_other in /etc/fuse.conf unless root)")
	f.BoolVar(&o.writeback, "writeback-cache", false, "kernel writeback cache: faster small writes, but O_APPEND from two mounts may overwrite each other")
	f.BoolVar(&o.localLocks, "local-locks", false, "keep fcntl and flock locks in this host's kernel: they then exclude processes of this host only, not of other mounts (docs/fuse.md)")
	f.BoolVar(&o.force, "force-unmount", false, "detach a live FUSE mount already on MOUNTPOINT instead of refusing")
	f.BoolVar(&o.noWatch, "no-watch", false, "do not apply the cluster's change events (other mounts' changes then show after --attr-timeout)")
	f.DurationVar(&o.attrTimeout, "attr-timeout", fuse.DefaultAttrTimeout, "how long the kernel caches attributes and names without capabilities (with them: what a capability covers, while it can be trusted)")
	f.DurationVar(&o.opTimeout, "op-timeout", 30*time.Second, "an operation fails with EIO when the cluster does not answer for this long")
	f.IntVar(&o.readaheadKiB, "readahead-kb", fuse.DefaultReadaheadKiB, "kernel readahead window in KiB (needs root; -1 leaves the kernel default)")
	o.dataCache = fuse.DefaultDataCache
	f.Var(&o.dataCache, "data-cache", "file data kept in the mount's memory for later reads while change events arrive (0: readahead only)")
	f.BoolVar(&o.debug, "debug", false, "log every FUSE request and reply")
	f.StringVar(&o.logFile, "log", "", "with --daemon: append the mount's log to this file (default: discard)")
	f.StringVar(&o.binding, "binding", fuse.BindingGoFuse, "FUSE library serving the mount: gofuse (go-fuse: 1 MiB requests, READDIRPLUS, negative entries) or bazil (bazil.org/fuse); docs/fuse.md")
	f.StringVar(&o.atime, "atime", fuse.AtimeNo, "noatime: reads never move access times; relatime: the first read after a change does, one background command each (docs/fuse.md)")
	f.BoolVar(&o.hugePages, "huge-pages", true, hugePagesUsage)
	f.BoolVar(&o.caps, "caps", true, "hold capabilities: answer lookups, stats, listings and read-only opens of files nobody else changes without asking the cluster (docs/fuse.md)")
	f.DurationVar(&o.lease, "lease", 0, "the mount's session lease: how long a mount that died or was cut off keeps other clients waiting for its capabilities (0: the client's default, 10s)")
	f.BoolVar(&o.sync, "sync", false, "commit every metadata change before answering it, instead of answering changes in directories the mount holds exclusively at once and committing them in ordered batches by fsync, unmount or a recall (docs/fuse.md)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve the mount's Prometheus metrics (per-operation counts and latency, cache hits, recalls, journal) at http://ADDR/metrics, with /livez and Go profiles")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the mount process to this file until it unmounts")
	return cmd
}

// mountReadyFD is the descriptor on which a --daemon child reports that the
// mount is ready ("ok") or why it failed.
const mountReadyFD = 3

// mountChildEnv marks the detached child of `memfs mount --daemon`.
const mountChildEnv = "MEMFS_MOUNT_DAEMON_CHILD"

// fuseOptions turns the flags into the mount's options.
func (o *mountOptions) fuseOptions() fuse.Options {
	var debugf func(any)
	if o.debug {
		debugf = func(msg any) { slog.Info("fuse", "msg", fmt.Sprint(msg)) }
	}
	return fuse.Options{
		Debug:          debugf,
		AttrTimeout:    o.attrTimeout,
		OpTimeout:      o.opTimeout,
		AllowOther:     o.allowOther,
		WritebackCache: o.writeback,
		LocalLocks:     o.localLocks,
		ForceUnmount:   o.force,
		NoWatch:        o.noWatch,
		ReadaheadKiB:   o.readaheadKiB,
		DataCache:      dataCacheOption(int64(o.dataCache)),
		Binding:        o.binding,
		Atime:          o.atime,
		Sync:           o.sync,
	}
}

// dataCacheOption maps the --data-cache size to fuse.Options.DataCache,
// where 0 means the default and a negative size none.
func dataCacheOption(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

// mountHeadroom is how far the mount's heap may grow past its live data
// before a collection (internal/heapgoal; docs/fuse.md).
const mountHeadroom = 128 << 20

// tuneMountGC sets the GC of a process that serves a mount: a mount
// allocates for every request, and fewer collections speed up metadata
// work (the Go default is 100), so a small heap runs at 400. The data cache
// is live memory, though, and every byte of headroom past it is memory a
// cold read touches for the first time: the heap may grow only
// mountHeadroom past its live data.
func tuneMountGC() *heapgoal.Tuner {
	return heapgoal.Start(mountHeadroom, 400, slog.Default())
}

func runMount(cmd *cobra.Command, args []string, o *mountOptions) error {
	if err := fuse.CheckBinding(o.binding); err != nil {
		return usageError{fmt.Errorf("--binding %w", err)}
	}
	if o.daemon && os.Getenv(mountChildEnv) == "" {
		return o.startMountDaemon(cmd, args[0])
	}
	// A soft limit caps the heap whatever the tuner allows.
	defer tuneMountGC().Stop()
	heap := 2*int64(o.dataCache) + 256<<20
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(heap)
	}
	if o.hugePages {
		reserveHugePages(slog.Default(), uint64(heap))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opt := o.fuseOptions()
	if o.metricsAddr != "" {
		// Listening before mounting, so that a taken port fails the
		// mount instead of leaving it without its metrics.
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		opt.Metrics = reg
		if _, err := opsweb.Serve(ctx, o.metricsAddr, opsweb.Handler(opsweb.Options{Registry: reg}), slog.Default()); err != nil {
			err = fmt.Errorf("--metrics-addr: %w", err)
			notifyParent(err)
			return err
		}
	}
	m, c, err := o.mountCluster(ctx, cmd, args[0], opt)
	notifyParent(err)
	if err != nil {
		return err
	}
	defer c.Close()
	if o.cpuProfile != "" {
		stopProfile, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	slog.Info("mounted", "dir", m.Dir(), "cluster", global.cluster)
	if os.Getenv(mountChildEnv) == "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "memfs: cluster mounted on %s; Ctrl-C or \"fusermount3 -u %s\" unmounts\n", m.Dir(), m.Dir())
	}
	select {
	case <-ctx.Done():
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Unmount(uctx); err != nil {
			return fmt.Errorf("unmount %s: %w", m.Dir(), err)
		}
	case <-m.Done():
		if err := m.Err(); err != nil {
			return fmt.Errorf("serving %s: %w", m.Dir(), err)
		}
	}
	slog.Info("unmounted", "dir", m.Dir())
	return nil
}

// startCPUProfile profiles this process into path until the returned
// function is called (for finding where a mount's time goes).
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// mountCluster connects to --cluster and mounts it on dir.
func (o *mountOptions) mountCluster(ctx context.Context, cmd *cobra.Command, dir string, opt fuse.Options) (*fuse.MountPoint, *client.Client, error) {
	sctx, cancel := context.WithTimeout(ctx, global.timeout)
	defer cancel()
	cmd.SetContext(sctx)
	var copts []client.Option
	if o.caps {
		copts = append(copts, client.WithCaps())
	}
	if o.lease > 0 {
		copts = append(copts, client.WithLease(o.lease))
	}
	c, err := newClient(cmd, copts...)
	if err != nil {
		return nil, nil, err
	}
	m, err := fuse.Mount(sctx, c, dir, opt)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return m, c, nil
}

// notifyParent tells the `memfs mount --daemon` that started this process
// whether the mount is ready.
func notifyParent(err error) {
	if os.Getenv(mountChildEnv) == "" {
		return
	}
	f := os.NewFile(mountReadyFD, "mount-ready")
	if f == nil {
		return
	}
	defer f.Close()
	msg := "ok\n"
	if err != nil {
		msg = "error: " + strings.ReplaceAll(errorText(err), "\n", " ") + "\n"
	}
	_, _ = io.WriteString(f, msg)
}

// startMountDaemon runs this command again, detached (new session, no
// terminal), and returns once the child reports the mount ready.
func (o *mountOptions) startMountDaemon(cmd *cobra.Command, dir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	child := exec.Command(exe, withoutDaemonFlag(os.Args[1:])...)
	child.Env = append(os.Environ(), mountChildEnv+"=1")
	child.ExtraFiles = []*os.File{w} // fd 3
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	logf, err := o.daemonLog()
	if err != nil {
		w.Close()
		return err
	}
	child.Stdout, child.Stderr = logf, logf
	err = child.Start()
	w.Close()
	logf.Close()
	if err != nil {
		return fmt.Errorf("start mount process: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		if s == "ok" {
			fmt.Fprintf(cmd.OutOrStdout(), "mounted on %s (pid %d); unmount with \"fusermount3 -u %s\" or kill %d\n",
				dir, child.Process.Pid, dir, child.Process.Pid)
			return nil
		}
		if s == "" {
			s = "mount process exited without a word"
		}
		return errors.New(strings.TrimPrefix(s, "error: "))
	case <-time.After(global.timeout + 30*time.Second):
		_ = child.Process.Kill()
		return fmt.Errorf("mount not ready after %v", global.timeout+30*time.Second)
	}
}

// daemonLog is where a detached mount writes its log.
func (o *mountOptions) daemonLog() (*os.File, error) {
	if o.logFile == "" {
		return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	return os.OpenFile(o.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
}

// withoutDaemonFlag drops --daemon (in any spelling) from args.
func withoutDaemonFlag(args []string) []string {
	var out []string
	for _, a := range args {
		if a == "--daemon" || strings.HasPrefix(a, "--daemon=") {
			continue
		}
		out = append(out, a)
	}
	return out
}
