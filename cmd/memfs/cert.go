package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/internal/pki"
)

type certOptions struct {
	dir, keyType, role, path string
	hosts, nodes             []string
	ttl                      time.Duration
}

func newCertCmd() *cobra.Command {
	o := &certOptions{}
	certCmd := &cobra.Command{
		Use:   "cert",
		Short: "Make a cluster's CA, node and client certificates",
		Long: `Make the certificates a TLS cluster needs, as PEM files in --dir:
ca.crt and ca.key (the CA), NAME.crt and NAME.key (each certificate).

  memfs cert ca     --dir certs
  memfs cert node   node1 --dir certs --host 10.0.0.1,node1.example,localhost
  memfs cert client alice --dir certs --role write
  memfs cert init   --dir certs --nodes node1,node2,node3 --host 10.0.0.1,10.0.0.2,10.0.0.3

init makes whatever of a whole cluster's set is missing (the CA, a node
certificate per --nodes name, each valid for every --host, and an "admin"
client certificate) and keeps what exists, so it can run at every start
(the compose cluster's init service does).

A certificate's role is its subject's organizational unit: node (a cluster
member), admin, write or read (clients). Certificates from your own CA work
the same way when they carry these (docs/security.md).`,
	}
	pf := certCmd.PersistentFlags()
	pf.StringVar(&o.dir, "dir", "certs", "directory of ca.crt, ca.key and the certificates")
	pf.StringVar(&o.keyType, "key-type", pki.Ed25519, "key type: ed25519 or ecdsa (P-256)")
	pf.DurationVar(&o.ttl, "ttl", 0, "validity (default: ten years for the CA, one year otherwise)")
	caCmd := &cobra.Command{
		Use: "ca", Short: "Make a new CA (refuses to overwrite one)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := os.Stat(filepath.Join(o.dir, pki.CAFile)); err == nil {
				return explainedError{fmt.Errorf("%s already holds a CA; remove it first to make a new one", o.dir)}
			}
			ca, err := pki.NewCA(pki.Request{TTL: o.ttl, KeyType: o.keyType})
			if err != nil {
				return usageError{err}
			}
			if err := ca.WriteCA(o.dir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s\n",
				filepath.Join(o.dir, pki.CAFile), filepath.Join(o.dir, pki.CAKeyFile))
			return nil
		},
	}
	nodeCmd := &cobra.Command{
		Use: "node NAME", Short: "Make a node certificate signed by the CA", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(o.hosts) == 0 {
				return usageError{errors.New("--host is required: the addresses and names clients dial this node by")}
			}
			return o.issueCert(cmd, args[0], pki.RoleNode, o.hosts)
		},
	}
	nodeCmd.Flags().StringSliceVar(&o.hosts, "host", nil, "IP addresses and DNS names of the node (comma-separated)")
	clientCmd := &cobra.Command{
		Use: "client NAME", Short: "Make a client certificate signed by the CA", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.issueCert(cmd, args[0], o.role, nil)
		},
	}
	clientCmd.Flags().StringVar(&o.role, "role", pki.RoleRead, "role: read, write or admin")
	clientCmd.Flags().StringVar(&o.path, "path", "", "confine the client to this directory, which it sees as / (read and write roles)")
	initCmd := &cobra.Command{
		Use: "init", Short: "Make the missing certificates of a whole cluster (CA, nodes, admin)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(o.nodes) == 0 || len(o.hosts) == 0 {
				return usageError{errors.New("--nodes and --host are required")}
			}
			if err := pki.ClusterSetup(o.dir, o.nodes, o.hosts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "certificates of %v and admin are in %s\n", o.nodes, o.dir)
			return nil
		},
	}
	initCmd.Flags().StringSliceVar(&o.nodes, "nodes", nil, "node ids (comma-separated)")
	initCmd.Flags().StringSliceVar(&o.hosts, "host", nil, "IP addresses and DNS names of all nodes (comma-separated)")
	certCmd.AddCommand(caCmd, nodeCmd, clientCmd, initCmd)
	return certCmd
}

func (o *certOptions) issueCert(cmd *cobra.Command, name, role string, hosts []string) error {
	if role == pki.RoleNode && cmd.Name() == "client" {
		return usageError{errors.New("--role node: use `memfs cert node`")}
	}
	ca, err := pki.LoadCA(o.dir)
	if err != nil {
		return explainedError{fmt.Errorf("load the CA from %s (make one with `memfs cert ca`): %w", o.dir, err)}
	}
	p, err := ca.Issue(pki.Request{Name: name, Role: role, Hosts: hosts, Path: o.path, TTL: o.ttl, KeyType: o.keyType})
	if err != nil {
		return usageError{err}
	}
	if err := p.Write(o.dir, name); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s (role %s, valid until %s)\n",
		pki.CertFile(o.dir, name), pki.KeyFile(o.dir, name), role, p.Cert.NotAfter.Format(time.DateOnly))
	return nil
}
