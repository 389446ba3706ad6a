package server

import (
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
)

// frameStream replays frames as a FetchBlocks stream.
type frameStream struct {
	grpc.ClientStream
	frames []*pb.BlockFrame
}

func (s *frameStream) Recv() (*pb.BlockFrame, error) {
	if len(s.frames) == 0 {
		return nil, io.EOF
	}
	f := s.frames[0]
	s.frames = s.frames[1:]
	return f, nil
}

// FuzzRecvBlock feeds arbitrary frames (each a protobuf-encoded BlockFrame,
// as they come off the network) to the block reassembler: it must never
// panic, and whatever it returns as a block must hash to what was asked.
func FuzzRecvBlock(f *testing.F) {
	data := []byte("a block of some bytes")
	h := block.Sum(data)
	enc := func(fr *pb.BlockFrame) []byte { b, _ := proto.Marshal(fr); return b }
	f.Add(enc(&pb.BlockFrame{Hash: h[:], Size: uint64(len(data)), Data: data}), []byte{})
	f.Add(enc(&pb.BlockFrame{Hash: h[:], Size: uint64(len(data)), Data: data[:5]}),
		enc(&pb.BlockFrame{Hash: h[:], Offset: 5, Size: uint64(len(data)), Data: data[5:]}))
	f.Add(enc(&pb.BlockFrame{Hash: h[:], Absent: true}), []byte{})
	f.Add(enc(&pb.BlockFrame{Hash: h[:], Size: 1 << 40, Data: data}), []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var frames []*pb.BlockFrame
		for _, raw := range [][]byte{a, b} {
			fr := &pb.BlockFrame{}
			if proto.Unmarshal(raw, fr) == nil {
				frames = append(frames, fr)
			}
		}
		got, err := recvBlock(&frameStream{frames: frames}, fsm.BlockWant{Hash: h, Size: uint64(len(data))})
		if err == nil && got != nil && block.Sum(got) != h {
			t.Fatalf("accepted a block that does not match its hash")
		}
	})
}
