// Command memfs runs MemoryFS nodes (server, up) and talks to a running
// cluster (status, health, top, check perf, node, and the file commands).
//
// It only wires packages together: the node is package server, the file
// commands use package client. It must not hold logic those packages need.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// defaultCluster matches the API addresses `memfs up` uses by default.
const defaultCluster = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

// global holds the root's persistent flags. They are the one package
// variable of flags: the helpers every command shares (clusterAddrs,
// commandContext, clientSecurity, errorText) read them.
var global struct {
	cluster       string
	timeout       time.Duration
	quiet         bool
	ca, cert, key string
	tokenFile     string
}

// newRootCmd builds the command tree: one constructor per command, each
// with its own flags.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "memfs",
		Short: "MemoryFS: a replicated in-memory file system",
		Long: `MemoryFS keeps a POSIX-like file tree in the memory of 3 or 5 nodes,
replicated with Raft. Start a local cluster with "memfs up", then use the
file commands against it.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	def := os.Getenv("MEMFS_CLUSTER")
	if def == "" {
		def = defaultCluster
	}
	pf := root.PersistentFlags()
	pf.StringVar(&global.cluster, "cluster", def,
		"comma-separated API addresses of cluster nodes (env MEMFS_CLUSTER)")
	pf.DurationVar(&global.timeout, "timeout", 30*time.Second,
		"give up on an operation the cluster has not answered after this long (a transfer lasts as long as its pieces keep being answered)")
	pf.BoolVarP(&global.quiet, "quiet", "q", false,
		"no progress bars (they are drawn only on a terminal anyway)")
	securityFlags(pf)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newServerCmd(), newUpCmd(), newMountCmd(),
		newStatusCmd(), newHealthCmd(), newTopCmd(), newCheckCmd(),
		newNodeCmd(), newCertCmd(), newTokenCmd(),
		newBenchCmd(), newRegionCmd(), newCloneCmd(), newDuCmd(),
	)
	root.AddCommand(newFileCmds()...)
	return root
}

// clusterAddrs returns the --cluster addresses.
func clusterAddrs() []string {
	var out []string
	for _, a := range strings.Split(global.cluster, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// needCluster is clusterAddrs, or a usage error when there are none.
func needCluster() ([]string, error) {
	addrs := clusterAddrs()
	if len(addrs) == 0 {
		return nil, usageError{errors.New("no cluster addresses (set --cluster or MEMFS_CLUSTER)")}
	}
	return addrs, nil
}

// commandContext is the context of a command that is one operation
// (status, node admin): cancelled by Ctrl-C or SIGTERM, and after
// --timeout.
func commandContext() (context.Context, context.CancelFunc) {
	ctx, stop := interruptContext()
	ctx, cancel := context.WithTimeout(ctx, global.timeout)
	return ctx, func() { cancel(); stop() }
}

// interruptContext is cancelled by Ctrl-C or SIGTERM only. The file
// commands run under it: a copy of any size may take as long as it needs,
// while the client bounds each of its operations by --timeout.
func interruptContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// explainedError is an error whose text already explains itself: no
// generic hint is added.
type explainedError struct{ error }

func (e explainedError) Unwrap() error { return e.error }

// usageError marks a mistake in the command line (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// cobraUsage are the beginnings of cobra's own command-line errors.
var cobraUsage = []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ",
	"requires at least", "requires at most", "invalid argument", "flag needs an argument",
	"required flag", "if any flags in the group"}

func isUsage(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	for _, p := range cobraUsage {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	return false
}

var rpcPrefix = regexp.MustCompile(`rpc error: code = \w+ desc = `)

// errorText makes an error readable: gRPC's "rpc error: code = ... desc ="
// wrapping goes, and the common network failures get a hint.
func errorText(err error) string {
	msg := rpcPrefix.ReplaceAllString(err.Error(), "")
	var done explainedError
	switch {
	case errors.As(err, &done):
		return msg // says already what happened and what to do
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		return msg + fmt.Sprintf(" (no answer within --timeout %v)", global.timeout)
	case strings.Contains(msg, "connection refused"):
		return msg + fmt.Sprintf(" (is the cluster running? --cluster is %q)", global.cluster)
	}
	return msg
}

func main() {
	// Logs go to stderr in slog's own format. Without a handler of our own
	// slog writes through the standard log package, whose output a
	// dependency (coreos/pkg's capnslog, under raft-wal) takes over at
	// init, so lines came out in its format wherever a command logged.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	err := newRootCmd().Execute()
	if err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "memfs: %s\n", errorText(err))
	if isUsage(err) {
		os.Exit(2)
	}
	os.Exit(1)
}
