// Package server is a MemoryFS node: it replicates the fsm state machine
// with hashicorp/raft and serves the MemFS gRPC service on TCP and,
// optionally, a Unix socket.
//
// A node owns the Raft wiring (log, stable and snapshot stores, transport,
// bootstrap and join), the command path (a batcher that coalesces
// concurrent commands into one log entry, stamped with the leader's clock),
// forwarding from followers to the leader, linearizable and stale reads,
// the admin calls (status, join, remove), and metrics.
//
// Log entries carry a one-byte type ahead of their payload: file system
// entries (a pb.Entry for the fsm package) and node metadata (the API
// address of each member, which Raft itself does not know). The fsm package
// never sees the metadata, and this package never interprets a pb.Entry
// beyond building one.
//
// It must never let client input crash the process, never apply a command
// that a client cut off mid-stream, and never acknowledge a write before
// Raft has committed and applied it.
package server
