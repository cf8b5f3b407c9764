package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"bex.co/bex/edge"
)

// edgeCmd serves every app over HTTP from the routing table. HTTPS with automatic
// certificates is the next step of the edge; until then this listener is what routes.
type edgeCmd struct {
	errOut io.Writer
	log    *slog.Logger

	apiFlags
	namespace  string
	baseDomain string
	httpAddr   string

	// ready, when set, receives the listen address once the edge accepts.
	ready chan<- string
}

func (c *edgeCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "edge",
		Short: "Route requests for <app>.<base-domain> and custom domains to the apps' instances",
		Long: "edge serves every app over HTTP, routing by Host from the Apps and the EndpointSlices\n" +
			"the deployer publishes. Every flag can also be set as BEX_<FLAG>, e.g. BEX_HTTP_ADDR.",
		Args:    cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) },
	}
	f := cmd.Flags()
	c.apiFlags.bind(f, "state directory (for the default kubeconfig)")
	f.StringVar(&c.namespace, "namespace", "default", "namespace of the Apps")
	f.StringVar(&c.baseDomain, "base-domain", "localhost", "apps answer at <app>.<base-domain>")
	f.StringVar(&c.httpAddr, "http-addr", ":80", "HTTP listen address")
	return cmd
}

func (c *edgeCmd) run(ctx context.Context) error {
	restCfg, s, err := c.connect()
	if err != nil {
		return err
	}
	cfg := edge.Config{BaseDomain: c.baseDomain, Namespace: c.namespace}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	informers, err := cache.New(restCfg, cache.Options{Scheme: s, DefaultNamespaces: map[string]cache.Config{c.namespace: {}}})
	if err != nil {
		return err
	}
	table, err := edge.NewTable(ctx, cfg, informers, c.log)
	if err != nil {
		return err
	}
	go func() {
		if err := informers.Start(ctx); err != nil {
			c.log.Error("API cache stopped", "err", err)
		}
	}()
	proxy, err := edge.NewProxy(cfg, table, c.log, prometheus.DefaultRegisterer)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: proxy}
	proxy.ConfigureServer(srv)
	l, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.errOut, "bex edge: serving http://<app>.%s on %s\n", c.baseDomain, l.Addr())
	if c.ready != nil {
		c.ready <- l.Addr().String()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (c *edgeCmd) close() error { return nil }
