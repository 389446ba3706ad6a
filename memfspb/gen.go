// Package memfspb holds the MemoryFS gRPC service and the messages that are
// both its requests and the commands in the Raft log. The Go files are
// generated from memfs.proto and checked in; it must never hold logic.
package memfspb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative memfs.proto
