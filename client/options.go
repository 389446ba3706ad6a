package client

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Defaults for the options below.
const (
	DefaultLease          = 10 * time.Second
	DefaultRetryTimeout   = 30 * time.Second
	DefaultAttemptTimeout = 5 * time.Second
)

// Option configures a Client in New.
type Option func(*config)

// Dialer opens the connection to one node address. Addresses are what New
// was given ("host:port" or "unix:///path") or what a node reported as the
// leader's API address.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

type config struct {
	lease          time.Duration
	retryTimeout   time.Duration
	attemptTimeout time.Duration
	consistency    pb.Consistency
	dialer         Dialer
	log            *slog.Logger
	uid, gid       uint32
	name           string
	caps           bool
	tls            *tls.Config // nil: plaintext
	token          string      // bearer token sent with every call, or ""
}

func defaultConfig() config {
	return config{
		lease:          DefaultLease,
		retryTimeout:   DefaultRetryTimeout,
		attemptTimeout: DefaultAttemptTimeout,
		consistency:    pb.Consistency_LINEARIZABLE,
		dialer:         DialAddr,
		log:            slog.New(slog.DiscardHandler),
		uid:            ownID(os.Getuid()),
		gid:            ownID(os.Getgid()),
		name:           describeProcess(),
	}
}

func ownID(id int) uint32 {
	if id < 0 {
		return 0
	}
	return uint32(id)
}

func describeProcess() string {
	host, _ := os.Hostname()
	return host + " pid " + strconv.Itoa(os.Getpid())
}

// WithCaps makes the client hold capabilities, so that it may cache what
// they cover: Client.Caps returns the table of the ones it holds (see
// Caps). Without it (the default) the client holds none and every read
// asks the cluster.
func WithCaps() Option { return func(c *config) { c.caps = true } }

// WithLease sets the session lease the client asks for (default 10 s). The
// client renews it every lease/4; a session not renewed for a whole lease
// (measured on the cluster's log time) expires and loses its open handles
// and exclusive opens.
func WithLease(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.lease = d
		}
	}
}

// WithRetryTimeout bounds how long one call keeps retrying while the cluster
// is unreachable or electing a leader. A call whose context has a deadline
// retries until that deadline; a call without one (and every method that
// takes no context) retries for at most this long (default 30 s).
func WithRetryTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retryTimeout = d
		}
	}
}

// WithAttemptTimeout bounds one attempt of one RPC (default 5 s, plus time
// for the data of large transfers). An attempt that runs out is retried
// with the same request identity, so a node that hangs costs at most this
// much before the client moves on.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.attemptTimeout = d
		}
	}
}

// WithConsistency sets the consistency of reads (default LINEARIZABLE: the
// leader confirms its leadership before answering). STALE reads a node's
// local state, which may lag the leader.
func WithConsistency(level pb.Consistency) Option {
	return func(c *config) { c.consistency = level }
}

// WithDialer replaces how connections to nodes are made, for example to put
// a fault-injecting proxy in between. The default is DialAddr.
func WithDialer(d Dialer) Option {
	return func(c *config) {
		if d != nil {
			c.dialer = d
		}
	}
}

// WithLogger sets where the client logs retries and session renewals
// (default: nowhere).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}

// WithIdentity sets the owner of files, directories and symlinks the client
// creates (default: this process's uid and gid).
func WithIdentity(uid, gid uint32) Option {
	return func(c *config) { c.uid, c.gid = uid, gid }
}

// WithName sets the free-form description of the client that the cluster
// shows for its session (default: host name and process id).
func WithName(name string) Option {
	return func(c *config) { c.name = name }
}

// WithTLS makes the client speak TLS to the nodes with this configuration:
// its RootCAs (or VerifyConnection) check the nodes' certificates, and its
// Certificates or GetClientCertificate carry the client's certificate, if
// it authenticates with one. The cluster's CLI builds it from --ca, --cert
// and --key (see docs/security.md).
func WithTLS(c *tls.Config) Option { return func(cfg *config) { cfg.tls = c } }

// WithToken authenticates every call with a bearer token made by
// `memfs token create`. It needs WithTLS: a token is never sent in the
// clear.
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// DialAddr is the default Dialer: "unix:///path" (or "unix:/path") dials a
// Unix socket, anything else is a TCP "host:port".
func DialAddr(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if p, ok := unixPath(addr); ok {
		return d.DialContext(ctx, "unix", p)
	}
	return d.DialContext(ctx, "tcp", addr)
}

func unixPath(addr string) (string, bool) {
	const scheme = "unix:"
	if len(addr) <= len(scheme) || addr[:len(scheme)] != scheme {
		return "", false
	}
	p := addr[len(scheme):]
	// unix:///abs/path and unix:/abs/path name the same socket.
	for len(p) > 1 && p[0] == '/' && p[1] == '/' {
		p = p[1:]
	}
	return p, true
}
