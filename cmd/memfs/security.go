package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/internal/tlsconf"
)

// securityFlags registers the TLS files and the token every command that
// reaches a node takes; `memfs server` takes the same files for its own
// certificate.
func securityFlags(pf *pflag.FlagSet) {
	pf.StringVar(&global.ca, "ca", os.Getenv("MEMFS_CA"),
		"PEM file of the cluster's CA: speak TLS and trust nodes it signed (env MEMFS_CA)")
	pf.StringVar(&global.cert, "cert", os.Getenv("MEMFS_CERT"),
		"PEM certificate to authenticate with (env MEMFS_CERT)")
	pf.StringVar(&global.key, "key", os.Getenv("MEMFS_KEY"),
		"PEM private key of --cert (env MEMFS_KEY)")
	pf.StringVar(&global.tokenFile, "token-file", os.Getenv("MEMFS_TOKEN_FILE"),
		"file holding a token made by \"memfs token create\" to authenticate with (env MEMFS_TOKEN_FILE)")
}

// tlsFiles are the --ca/--cert/--key files, checked to go together.
func tlsFiles() (tlsconf.Files, error) {
	f := tlsconf.Files{CA: global.ca, Cert: global.cert, Key: global.key}
	if (f.Cert == "") != (f.Key == "") {
		return f, usageError{errors.New("--cert and --key go together")}
	}
	if f.CA == "" && f.Cert != "" {
		return f, usageError{errors.New("--cert needs --ca (the CA that signed the nodes' certificates)")}
	}
	return f, nil
}

// clientSecurity turns the flags into client options: none without --ca
// (plaintext, for a cluster run with --insecure).
func clientSecurity() ([]client.Option, error) {
	files, err := tlsFiles()
	if err != nil {
		return nil, err
	}
	var opts []client.Option
	if files.CA != "" {
		src, err := tlsconf.Load(files, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, explainedError{fmt.Errorf("TLS files: %w", err)}
		}
		opts = append(opts, client.WithTLS(src.ClientConfig()))
	}
	if global.tokenFile != "" {
		if files.CA == "" {
			return nil, usageError{errors.New("--token-file needs --ca: a token is only sent over TLS")}
		}
		b, err := os.ReadFile(global.tokenFile)
		if err != nil {
			return nil, explainedError{fmt.Errorf("--token-file: %w", err)}
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return nil, explainedError{fmt.Errorf("--token-file %s is empty", global.tokenFile)}
		}
		opts = append(opts, client.WithToken(tok))
	}
	return opts, nil
}

// adminNet is how the admin commands reach nodes.
func adminNet() (replace.Net, error) {
	sec, err := clientSecurity()
	return replace.Net{Security: sec}, err
}
