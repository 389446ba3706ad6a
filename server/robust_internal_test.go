package server

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/memoryfs/memfs/fsm"
)

func TestPanicInHandlerBecomesInternal(t *testing.T) {
	f, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	n := &Node{cfg: Config{ID: "t"}, log: slog.New(slog.DiscardHandler), metrics: newMetrics("t", f.Stats, func() uint64 { return 0 }, &traffic{})}
	_, err = n.recoverUnary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x"},
		func(context.Context, any) (any, error) { panic("boom") })
	require.Equal(t, codes.Internal, status.Code(err))
	err = n.recoverStream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/y"},
		func(any, grpc.ServerStream) error { panic("boom") })
	require.Equal(t, codes.Internal, status.Code(err))
}
