package infra

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// BenchmarkManifests measures, for each overlay and for all of them together, the
// rendered size, the render (`kubectl kustomize` and the variable substitution)
// and the server-side dry-run with the real CRDs through `kubectl apply`, beside
// the baseline: the same dry-run sent by a Go client, which is the API server's
// share without kubectl's start-up and discovery.
func BenchmarkManifests(b *testing.B) {
	cp := controlPlane(b)
	ensureNamespaces(b, cp)
	ns := cp.Namespace(b, "bench")
	ctx := context.Background()

	apiDryRun := func(b *testing.B, o overlay, data []byte) {
		for _, obj := range objects(b, data) {
			if o.vars != nil {
				obj.SetNamespace(ns)
			}
			if err := cp.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.DryRunAll,
				client.FieldOwner("bex-infra-bench"), client.ForceOwnership); err != nil {
				b.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	}

	var all [][]byte
	for _, o := range overlays {
		all = append(all, manifests(b, o))
		b.Run(filepath.Base(o.dir), func(b *testing.B) {
			// Reported after the loop: b.Loop resets the timer, and with it the
			// metrics reported so far.
			var data []byte
			var render, kubectlDry, apiDry time.Duration
			for b.Loop() {
				t0 := time.Now()
				data = manifests(b, o)
				t1 := time.Now()
				if err := dryRun(b, cp, namespaceFor(o, ns), data); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				apiDryRun(b, o, data)
				render, kubectlDry, apiDry = render+t1.Sub(t0), kubectlDry+time.Since(t1)-time.Since(t2), apiDry+time.Since(t2)
			}
			n := float64(b.N)
			b.ReportMetric(float64(len(data)), "bytes")
			b.ReportMetric(float64(len(objects(b, data))), "objects")
			b.ReportMetric(float64(render.Milliseconds())/n, "render-ms")
			b.ReportMetric(float64(kubectlDry.Milliseconds())/n, "dryrun-kubectl-ms")
			b.ReportMetric(float64(apiDry.Milliseconds())/n, "dryrun-api-ms")
		})
	}

	b.Run("all", func(b *testing.B) {
		size := 0
		for _, d := range all {
			size += len(d)
		}
		var kubectlDry, apiDry time.Duration
		for b.Loop() {
			t0 := time.Now()
			for i, o := range overlays {
				if err := dryRun(b, cp, namespaceFor(o, ns), all[i]); err != nil {
					b.Fatal(err)
				}
			}
			t1 := time.Now()
			for i, o := range overlays {
				apiDryRun(b, o, all[i])
			}
			kubectlDry, apiDry = kubectlDry+t1.Sub(t0), apiDry+time.Since(t1)
		}
		b.ReportMetric(float64(size), "bytes")
		b.ReportMetric(float64(kubectlDry.Milliseconds())/float64(b.N), "dryrun-kubectl-ms")
		b.ReportMetric(float64(apiDry.Milliseconds())/float64(b.N), "dryrun-api-ms")
	})
}
