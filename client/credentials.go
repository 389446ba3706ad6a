package client

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/memoryfs/memfs/internal/grpcopts"
	"github.com/memoryfs/memfs/internal/tlsconf"
)

// TokenMetadataKey is the request metadata that carries a bearer token
// ("Bearer " + token), as HTTP's Authorization header does.
const TokenMetadataKey = "authorization"

// credentialOptions are the dial options that carry the client's
// transport security and token, and the buffers and windows that suit
// it; client/replace and the CLI's admin commands dial with the same
// ones.
func (c *config) credentialOptions() []grpc.DialOption {
	var opts []grpc.DialOption
	if c.tls != nil {
		opts = append(opts, grpc.WithTransportCredentials(tlsconf.NewCredentials(c.tls)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	opts = append(opts, grpcopts.Client(c.tls != nil)...)
	if c.token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(c.token)))
	}
	return opts
}

// DialOptions returns the gRPC dial options that opts set for security
// (TLS and token), for programs that make raw connections to nodes.
func DialOptions(opts ...Option) []grpc.DialOption {
	c := defaultConfig()
	for _, o := range opts {
		o(&c)
	}
	return c.credentialOptions()
}

// bearer is a token sent with every call; gRPC refuses to send it over a
// connection without transport security.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{TokenMetadataKey: "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }
