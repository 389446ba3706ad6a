package fsm

// PLACEHOLDER: the fsm helper replaces this file with the real state machine.

import (
	"context"
	"errors"
	"io"
	"syscall"

	pb "github.com/memoryfs/memfs/proto"
)

// FSM is the state machine.
type FSM struct{ cfg Config }

// New returns an empty file system holding only the root directory.
func New(cfg Config) (*FSM, error) { return &FSM{cfg: cfg}, nil }

// Apply applies one decoded log entry at index and returns one result per command.
func (f *FSM) Apply(index uint64, e *pb.Entry) []*pb.Result { return nil }

// ApplyBytes decodes a log entry and applies it.
func (f *FSM) ApplyBytes(index uint64, data []byte) ([]*pb.Result, error) {
	return nil, errors.ErrUnsupported
}

// Query answers a read from the latest applied state.
func (f *FSM) Query(q *pb.Query) *pb.Result { return &pb.Result{Errno: uint32(syscall.ENOSYS)} }

// AppliedIndex returns the index of the last applied entry.
func (f *FSM) AppliedIndex() uint64 { return 0 }

// WaitApplied returns once index is applied or ctx is done.
func (f *FSM) WaitApplied(ctx context.Context, index uint64) error { return ctx.Err() }

// Changed returns a channel closed at the next apply.
func (f *FSM) Changed() <-chan struct{} { return nil }

// Stats returns totals.
func (f *FSM) Stats() Stats { return Stats{} }

// Snapshot captures the state.
func (f *FSM) Snapshot() Snapshot { return nil }

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(r io.Reader) error { return errors.ErrUnsupported }

var _ Applier = (*FSM)(nil)
