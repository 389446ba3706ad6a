// Package block is the content-addressed block store under the MemoryFS
// state machine: immutable chunks of file data keyed by their SHA-256,
// stored once however many files hold them, reference-counted, and freed
// when the last reference goes.
//
// The store knows nothing of files, paths or Raft. It must never change a
// block's bytes after Put, never read a clock, and never do I/O: every
// replica that applies the same Put/Ref/Release calls in the same order
// holds the same blocks and frees them at the same moment.
//
// Block bytes live off the Go heap, in mapped slabs (arena.go), so that a
// node's memory is its data plus a small heap rather than a heap the
// collector sizes in proportion to every stored byte. Mapping memory and
// handing pages back is the only thing the store asks of the kernel.
//
// Memory safety of freed blocks follows the CBUF rule without extra
// bookkeeping: the store drops its own pointer when the count reaches zero,
// while readers, snapshots and transfers that still hold the *Block keep its
// bytes alive until they let go; the collector then runs a cleanup that
// returns the slot. A slice of a block's bytes alone keeps nothing alive,
// so no such slice leaves this package: callers copy (ReadAt, Bytes) or
// borrow the bytes for the length of a callback (View), and each of these
// keeps the *Block reachable until it returns.
package block
