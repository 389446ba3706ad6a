package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// FuzzRequestValidation feeds arbitrary bytes to the checks Apply and
// Query make before any work: decoded as a request, a request either
// passes or is refused with InvalidArgument or FailedPrecondition, never a
// panic; a read that passes is clamped to one message.
func FuzzRequestValidation(f *testing.F) {
	for _, m := range []proto.Message{
		&pb.ApplyRequest{Version: pb.Version, Command: &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Sums: [][]byte{{1}}}}}},
		&pb.ApplyRequest{Version: pb.Version, Command: &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{}}}},
		&pb.QueryRequest{Version: pb.Version, Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Length: 1 << 40}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		refusal := func(err error) {
			if c := status.Code(err); err != nil && c != codes.InvalidArgument && c != codes.FailedPrecondition {
				t.Fatalf("refused with %v: %v", c, err)
			}
		}
		var a pb.ApplyRequest
		if proto.Unmarshal(data, &a) == nil {
			refusal(checkVersion(a.GetVersion()))
			refusal(checkCommand(a.GetCommand()))
		}
		var q pb.QueryRequest
		if proto.Unmarshal(data, &q) == nil {
			refusal(checkVersion(q.GetVersion()))
			if err := checkQuery(q.GetQuery()); err != nil {
				refusal(err)
				return
			}
			if r := clampRead(&q, pb.MaxMessageData).GetQuery().GetRead(); r != nil && r.Length > pb.MaxMessageData {
				t.Fatalf("read of %d bytes not clamped", r.Length)
			}
		}
	})
}
