// Package grpcopts holds the gRPC buffer and flow-control settings the
// API's file data streams run with, shared by the node, the client and
// the benchmark that measures them (internal/tlsconf's BenchmarkStream).
package grpcopts

import "google.golang.org/grpc"

const (
	// A stream's and a connection's flow-control windows: large enough
	// that 1 MiB messages, 16 in flight, flow without waiting for window
	// updates on every frame. Setting them turns off gRPC's window
	// estimation, which starts at 64 KiB.
	streamWindow = 4 << 20
	connWindow   = 16 << 20
	// gRPC writes its frames into a buffer of this size and hands the
	// buffer to the connection when it is full or the writer runs out of
	// work; the default, 32 KiB, costs a system call (and, under TLS, a
	// write of two records) per 32 KiB of file data. The buffer is shared
	// (taken from a pool for each batch), so an idle connection holds
	// none.
	writeBuffer = 256 << 10
	// Frames are read through a buffer of this size in plaintext, where
	// it saves system calls. Under TLS the record layer buffers already
	// (a read takes what is left of the current record, with no system
	// call for a frame header), and a buffer of gRPC's own would only
	// copy every byte once more.
	readBuffer = 64 << 10
)

func readBufferSize(tls bool) int {
	if tls {
		return 0
	}
	return readBuffer
}

// Server returns the node's options for its API, with or without TLS.
func Server(tls bool) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.WriteBufferSize(writeBuffer),
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(readBufferSize(tls)),
	}
}

// Client returns a client's options for its connections to nodes, with
// or without TLS.
func Client(tls bool) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithWriteBufferSize(writeBuffer),
		grpc.WithSharedWriteBuffer(true),
		grpc.WithReadBufferSize(readBufferSize(tls)),
	}
}
