// Package client is the Go client of a MemoryFS cluster: a connection that
// finds the Raft leader and follows it, a session, and two APIs over the
// gRPC protocol of package memfspb: a file API shaped after package os (Open,
// File.Read/Write/Seek, Mkdir, ReadDir, Rename...) plus an io/fs view, and
// an inode-level API (Do, Query, Lookup, OpenLoc, ReadHandle...) for a FUSE
// file system. It must never import the server or the state machine: it
// knows the cluster only through the protocol.
//
// # Writes and retries
//
// Every mutating operation is a pb.Command carrying the client's session
// and a sequence number. When the leader cannot be reached, is replaced, or
// an attempt times out, the client sends the same command again (same
// sequence number) to the leader a node names, or to the next node, with
// exponential backoff and jitter, until the call's context is done (or,
// without a deadline, the retry timeout passes). The state machine records
// the result of each (session, sequence number) and answers a repeat with
// it, so a write is never applied twice. A call that runs out of time
// returns an error wrapping ErrUnavailable and the context's error. A
// version mismatch or a malformed request fails at once.
//
// Writes are committed (on a majority of nodes) when they return; Sync has
// nothing to wait for. Up to pb.MaxMessageData of data goes in one Apply;
// more is streamed through the Write RPC as one command of up to
// MaxStreamWrite; more than that is split into several commands.
//
// # Errors
//
// An operation the state machine refuses returns an *fs.PathError (or an
// *os.LinkError for operations on two names) wrapping the syscall.Errno it
// returned, so errors.Is(err, fs.ErrNotExist), fs.ErrExist,
// fs.ErrPermission and errors.Is(err, syscall.ENOTEMPTY) work. Errno
// converts any error of this package to an errno.
//
// # Sessions
//
// New opens a session with a lease (WithLease, default 10 s) and renews it
// in the background every lease/4. Open handles and exclusive opens belong
// to the session. If the client is cut off for longer than the lease, the
// cluster expires the session (on log time) and drops its handles: the
// client opens a new session, operations on the old handles fail with
// ESTALE, and path operations go on. A command whose earlier attempt may
// have been applied in the expired session is not re-run in the new one
// (that could apply it twice); it fails with ESTALE.
//
// # Reads
//
// Reads are linearizable by default: the leader confirms its leadership
// before answering. WithConsistency(pb.Consistency_STALE) reads any node's
// local state instead.
package client
