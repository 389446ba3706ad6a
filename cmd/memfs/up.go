package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/fuse"
	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
	"github.com/memoryfs/memfs/server"
)

type upOptions struct {
	nodes       int
	dir         string
	basePort    int
	logStore    string
	memoryLimit string
	ephemeral   bool
	insecure    bool
	mount       string   // also mount the cluster here
	serverArgs  []string // after "--": passed to every node
}

func newUpCmd() *cobra.Command {
	o := &upOptions{}
	cmd := &cobra.Command{
		Use:   "up [-- SERVER_FLAGS...]",
		Short: "Start a local cluster of node processes on 127.0.0.1",
		Long: `Start a local cluster: one "memfs server" process per node on 127.0.0.1
(node i serves the API on base-port+i, Raft on base-port+100+i, and metrics,
/readyz and the status page on base-port+200+i), wait until every node is
ready, and print what to try next. Ctrl-C stops every node. Data stays
in --dir, so a second "memfs up" on the same dir finds the old files.
The nodes speak TLS: the first run makes a CA, a certificate per node and
an "admin" client certificate in DIR/tls (kept for later runs), and prints
the MEMFS_CA, MEMFS_CERT and MEMFS_KEY settings the other commands need.
--insecure runs them in plaintext without authentication instead.
Flags after "--" go to every "memfs server", e.g.
  memfs up -- --snapshot-threshold 512 --trailing-logs 256`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && cmd.ArgsLenAtDash() != 0 {
				return usageError{fmt.Errorf("up takes no arguments, only server flags after \"--\" (got %q)", args[0])}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runUp(cmd, args, o) },
	}
	f := cmd.Flags()
	f.IntVar(&o.nodes, "nodes", 3, "number of nodes")
	f.StringVar(&o.dir, "dir", ".memfs-cluster", "directory for the nodes' data and logs")
	f.IntVar(&o.basePort, "base-port", 7000, "node i listens on base-port+i (API), base-port+100+i (Raft) and base-port+200+i (metrics, status page)")
	f.StringVar(&o.logStore, "log-store", server.LogStoreBolt, "Raft log store of every node: bolt, wal or mem")
	f.StringVar(&o.memoryLimit, "memory-limit", "", "memory limit of every node (default: the server's)")
	f.BoolVar(&o.ephemeral, "ephemeral", false, "keep Raft state in memory (nothing persists)")
	f.BoolVar(&o.insecure, "insecure", false, "run the nodes in plaintext without authentication (a warning at every start)")
	f.StringVar(&o.mount, "mount", "", "also mount the cluster on this directory (FUSE; made if missing), until up stops")
	return cmd
}

// upNode is one child process.
type upNode struct {
	ID, APIAddr, RaftAddr, MetricsAddr, DataDir, LogPath string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status; read after done
}

// upCluster is what `memfs up` started; hooks receive it.
type upCluster struct {
	Dir   string
	Nodes []*upNode
	Out   io.Writer
	// CertDir holds the TLS files ("" with --insecure); Security are the
	// client options of its admin certificate.
	CertDir  string
	Security []client.Option

	opts  *upOptions   // the flags it was planned with
	exits chan *upNode // each node once, when it exits
}

// APIAddrs returns the nodes' API addresses.
func (c *upCluster) APIAddrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.APIAddr)
	}
	return out
}

func runUp(cmd *cobra.Command, args []string, o *upOptions) error {
	o.serverArgs = args
	if o.nodes < 1 {
		return usageError{errors.New("--nodes must be at least 1")}
	}
	if o.basePort < 1 || o.basePort+200+o.nodes > 65535 {
		return usageError{fmt.Errorf("--base-port %d leaves no room for %d nodes", o.basePort, o.nodes)}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := planUp(cmd.OutOrStdout(), o)
	if err != nil {
		return err
	}
	defer c.stopAll()
	if err := c.start(); err != nil {
		return err
	}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(c.Out, "interrupted; stopping the cluster...")
			return nil // Ctrl-C before the cluster was ready: a normal stop
		}
		return err
	}
	if o.mount != "" {
		unmount, err := startUpMount(ctx, o.mount, c.APIAddrs(), c.Security, c.Out, filepath.Join(c.Dir, "mount.log"))
		if err != nil {
			return err
		}
		defer unmount()
	}
	c.printNext()
	return c.wait(ctx)
}

// planUp lays out the nodes and decides who bootstraps: node 1, and only
// when no node dir holds Raft state yet.
func planUp(out io.Writer, o *upOptions) (*upCluster, error) {
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &upCluster{Dir: dir, Out: out, opts: o, exits: make(chan *upNode, o.nodes)}
	var ids []string
	for i := 1; i <= o.nodes; i++ {
		c.Nodes = append(c.Nodes, &upNode{
			ID:          fmt.Sprintf("n%d", i),
			APIAddr:     fmt.Sprintf("127.0.0.1:%d", o.basePort+i),
			RaftAddr:    fmt.Sprintf("127.0.0.1:%d", o.basePort+100+i),
			MetricsAddr: fmt.Sprintf("127.0.0.1:%d", o.basePort+200+i),
			DataDir:     filepath.Join(dir, fmt.Sprintf("node%d", i)),
			LogPath:     filepath.Join(dir, fmt.Sprintf("node%d.log", i)),
		})
		ids = append(ids, c.Nodes[i-1].ID)
	}
	if o.insecure {
		fmt.Fprintln(out, "WARNING: --insecure: the nodes serve plaintext without authentication; anyone who reaches their ports can read and change every file")
		return c, nil
	}
	c.CertDir = filepath.Join(dir, "tls")
	if err := pki.ClusterSetup(c.CertDir, ids, []string{"127.0.0.1", "localhost"}); err != nil {
		return nil, fmt.Errorf("make the cluster's certificates in %s: %w", c.CertDir, err)
	}
	src, err := tlsconf.Load(c.files("admin"), nil)
	if err != nil {
		return nil, err
	}
	c.Security = []client.Option{client.WithTLS(src.ClientConfig())}
	return c, nil
}

// files names the CA and certificate name in CertDir.
func (c *upCluster) files(name string) tlsconf.Files {
	return tlsconf.Files{CA: filepath.Join(c.CertDir, pki.CAFile),
		Cert: pki.CertFile(c.CertDir, name), Key: pki.KeyFile(c.CertDir, name)}
}

// start launches every node as a child process of this executable.
func (c *upCluster) start() error {
	o := c.opts
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	fresh := true
	if !o.ephemeral {
		for _, n := range c.Nodes {
			has, err := server.HasState(n.DataDir)
			if err != nil {
				return fmt.Errorf("inspect %s: %w", n.DataDir, err)
			}
			fresh = fresh && !has
		}
	}
	for i, n := range c.Nodes {
		args := []string{"server", "--id", n.ID, "--data", n.DataDir,
			"--raft-addr", n.RaftAddr, "--api-addr", n.APIAddr, "--metrics-addr", n.MetricsAddr,
			"--log-store", o.logStore}
		if o.memoryLimit != "" {
			args = append(args, "--memory-limit", o.memoryLimit)
		}
		if o.ephemeral {
			args = append(args, "--ephemeral")
		}
		if c.CertDir == "" {
			args = append(args, "--insecure")
		} else {
			f := c.files(n.ID)
			args = append(args, "--ca", f.CA, "--cert", f.Cert, "--key", f.Key)
		}
		if i == 0 && fresh {
			args = append(args, "--bootstrap")
		} else if others := otherAddrs(c, n); len(others) > 0 {
			// Ignored by a node that already has state.
			args = append(args, "--join", strings.Join(others, ","))
		}
		args = append(args, o.serverArgs...)
		if err := n.launch(exe, args, c.exits); err != nil {
			return err
		}
	}
	return nil
}

func otherAddrs(c *upCluster, self *upNode) []string {
	var out []string
	for _, n := range c.Nodes {
		if n != self {
			out = append(out, n.APIAddr)
		}
	}
	return out
}

func (n *upNode) launch(exe string, args []string, exits chan<- *upNode) error {
	log, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "--- %s: %s %s\n", time.Now().Format(time.RFC3339), exe, strings.Join(args, " "))
	n.cmd = exec.Command(exe, args...)
	n.cmd.Stdout, n.cmd.Stderr = log, log
	// Own process group: Ctrl-C reaches only `up`, which stops the nodes
	// in order.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start node %s: %w", n.ID, err)
	}
	n.done = make(chan struct{})
	go func() {
		n.err = n.cmd.Wait()
		log.Close()
		close(n.done)
		exits <- n
	}()
	return nil
}

// waitReady waits until every node answers /readyz (a member of a
// cluster with a leader, caught up), or a node exits, or timeout.
func (c *upCluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errc := make(chan error, len(c.Nodes))
	for _, n := range c.Nodes {
		go func() {
			if err := waitReadyz(ctx, n.MetricsAddr); err != nil {
				errc <- fmt.Errorf("node %s: %w", n.ID, err)
				return
			}
			errc <- nil
		}()
	}
	for range c.Nodes {
		select {
		case n := <-c.exits:
			return fmt.Errorf("node %s exited (%v); see %s", n.ID, n.err, n.LogPath)
		case err := <-errc:
			if err != nil {
				return fmt.Errorf("cluster not ready: %w (logs in %s)", err, c.Dir)
			}
		}
	}
	return nil
}

// printNext prints the nodes and the commands to try next.
func (c *upCluster) printNext() {
	me := "memfs"
	switch {
	case strings.Contains(os.Args[0], "go-build"):
		me = "go run ./cmd/memfs" // a `go run` binary is temporary
	case filepath.Base(os.Args[0]) != os.Args[0]:
		me = os.Args[0] // run by path: print a command that works as typed
	}
	w := c.Out
	fmt.Fprintf(w, "MemoryFS cluster of %d nodes is up (data and logs in %s)\n", len(c.Nodes), c.Dir)
	for _, n := range c.Nodes {
		fmt.Fprintf(w, "  %s  api %s  raft %s  status page http://%s/  log %s\n", n.ID, n.APIAddr, n.RaftAddr, n.MetricsAddr, n.LogPath)
	}
	fmt.Fprintf(w, "\nTry, in another shell:\n")
	fmt.Fprintf(w, "  export MEMFS_CLUSTER=%s\n", strings.Join(c.APIAddrs(), ","))
	if c.CertDir != "" {
		f := c.files("admin")
		fmt.Fprintf(w, "  export MEMFS_CA=%s MEMFS_CERT=%s MEMFS_KEY=%s\n", f.CA, f.Cert, f.Key)
	}
	var metrics []string
	for _, n := range c.Nodes {
		metrics = append(metrics, n.MetricsAddr)
	}
	fmt.Fprintf(w, "  export MEMFS_METRICS=%s\n", strings.Join(metrics, ","))
	fmt.Fprintf(w, "  echo hello > /tmp/hello.txt\n")
	fmt.Fprintf(w, "  %s put /tmp/hello.txt /hello.txt\n", me)
	fmt.Fprintf(w, "  %s ls -l /\n", me)
	fmt.Fprintf(w, "  %s cat /hello.txt\n", me)
	fmt.Fprintf(w, "  %s status\n", me)
	fmt.Fprintf(w, "  %s top\n", me)
	fmt.Fprintf(w, "\nPress Ctrl-C to stop the cluster; the data stays in %s.\n", c.Dir)
}

// wait runs until a signal or until every node has exited.
func (c *upCluster) wait(ctx context.Context) error {
	for alive := len(c.Nodes); alive > 0; alive-- {
		select {
		case <-ctx.Done():
			fmt.Fprintln(c.Out, "\nstopping the cluster...")
			return nil
		case n := <-c.exits:
			fmt.Fprintf(c.Out, "node %s exited (%v); see %s\n", n.ID, n.err, n.LogPath)
		}
	}
	return errors.New("every node has exited")
}

// stopAll sends SIGTERM to every running node (graceful: the leader hands
// over first), waits, and kills whatever is left after 30 s.
func (c *upCluster) stopAll() {
	for _, n := range c.Nodes {
		if n.cmd != nil && n.cmd.Process != nil {
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(30 * time.Second)
	for _, n := range c.Nodes {
		if n.done == nil {
			continue
		}
		select {
		case <-n.done:
		case <-deadline:
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	}
}

// startUpMount mounts the cluster at addrs on dir and returns the function
// that unmounts it. The mount's log goes to logPath, as each node's does:
// up's own output is for the person who started it.
func startUpMount(ctx context.Context, dir string, addrs []string, sec []client.Option, out io.Writer, logPath string) (func(), error) {
	// The README's first command mounts on ./mnt: made here when missing.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("mount: %w", err)
	}
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("mount: %w", err)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(logFile, nil)))
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := client.New(sctx, addrs, append(sec, client.WithName("memfs up --mount "+dir), client.WithCaps())...)
	if err != nil {
		return nil, fmt.Errorf("mount: connect: %w", err)
	}
	m, err := fuse.Mount(sctx, cl, dir, fuse.Options{})
	if err != nil {
		_ = cl.Close()
		return nil, fmt.Errorf("mount: %w", err)
	}
	fmt.Fprintf(out, "Mounted the cluster on %s (try: ls -l %s; log %s)\n", m.Dir(), m.Dir(), logPath)
	gc := tuneMountGC()
	return func() {
		defer gc.Stop()
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Unmount(uctx); err != nil {
			fmt.Fprintf(out, "unmount %s: %v\n", m.Dir(), err)
		}
		_ = cl.Close()
	}, nil
}
