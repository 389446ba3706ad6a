package server

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/proto"
	"github.com/memoryfs/memfs/server/authz"
)

// tokenMetadataKey carries "Bearer TOKEN" (client.TokenMetadataKey).
const tokenMetadataKey = "authorization"

// caller is who sent a request, as far as the node can tell.
type caller struct {
	name  string // certificate common name, or "token ID", for messages
	owner string // Command.owner of its commands: "cert:CN" or "token:ID"
	role  pb.Role
}

// identify finds the caller's role: a verified client certificate of the
// cluster's CA, else a bearer token stored in the replicated state and not
// expired (against this node's clock). A follower judges tokens by its own
// applied state, so a token works there, and stops working after a revoke,
// once the follower has applied the entry.
func (n *Node) identify(ctx context.Context) (caller, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			leaf := ti.State.VerifiedChains[0][0]
			cn := leaf.Subject.CommonName
			return caller{name: cn, owner: "cert:" + cn, role: authz.CertRole(leaf)}, nil
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(tokenMetadataKey)
	if len(vals) == 0 {
		return caller{}, status.Error(codes.Unauthenticated, "no client certificate or token: give --cert/--key or --token-file (docs/security.md)")
	}
	text, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || text == "" {
		return caller{}, status.Error(codes.Unauthenticated, "authorization is not a bearer token")
	}
	tok := n.fsm.Token(authz.TokenHash(text))
	if tok == nil {
		return caller{}, status.Error(codes.Unauthenticated, "unknown or revoked token")
	}
	if tok.ExpiresNs != 0 && time.Now().UnixNano() >= tok.ExpiresNs {
		return caller{}, status.Errorf(codes.Unauthenticated, "token %s expired at %s", tok.Id,
			time.Unix(0, tok.ExpiresNs).UTC().Format(time.RFC3339))
	}
	return caller{name: "token " + tok.Id, owner: "token:" + tok.Id, role: tok.Role}, nil
}

// authorize refuses a request whose caller lacks the role its method (and
// command or query) needs, before any work, and returns the caller. A node
// without TLS (--insecure) cannot tell callers apart: it authorizes
// everything, as if each were a node, and their owner is "".
func (n *Node) authorize(ctx context.Context, method string, req any) (caller, error) {
	if n.cfg.TLS == nil {
		return caller{role: pb.Role_ROLE_NODE}, nil
	}
	need := authz.Method(method)
	switch r := req.(type) {
	case *pb.ApplyRequest:
		need = max(need, authz.Command(r.GetCommand()))
	case *pb.QueryRequest:
		need = max(need, authz.Query(r.GetQuery()))
	}
	c, err := n.identify(ctx)
	if err != nil {
		return caller{}, err
	}
	if c.role < need {
		return caller{}, status.Errorf(codes.PermissionDenied, "%s (role %s) may not call %s: it needs role %s",
			c.name, authz.RoleName(c.role), method[strings.LastIndexByte(method, '/')+1:], authz.RoleName(need))
	}
	return c, nil
}

// stampOwner sets a command's owner to its caller's, unless a node
// forwarded it: the node that took it from the client stamped it already.
func stampOwner(ctx context.Context, cmd *pb.Command, c caller) {
	if cmd == nil || c.role == pb.Role_ROLE_NODE && isForwarded(ctx) {
		return
	}
	cmd.Owner = c.owner
}

func (n *Node) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, err := n.authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	if r, ok := req.(*pb.ApplyRequest); ok {
		stampOwner(ctx, r.GetCommand(), c)
	}
	return handler(ctx, req)
}

// authStream judges a stream by its method alone: a Write stream's
// command is a write (service.Write refuses any other), and the other
// streams carry no command.
func (n *Node) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c, err := n.authorize(ss.Context(), info.FullMethod, nil)
	if err != nil {
		return err
	}
	return handler(srv, &ownerStream{ServerStream: ss, caller: c})
}

// ownerStream stamps the owner on the command a Write stream carries.
type ownerStream struct {
	grpc.ServerStream
	caller caller
}

func (s *ownerStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if f, ok := m.(*pb.WriteFrame); ok && err == nil {
		stampOwner(s.Context(), f.GetCommand(), s.caller)
	}
	return err
}
