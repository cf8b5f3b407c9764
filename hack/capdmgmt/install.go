package main

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"bex.co/bex/internal/clusterapi"
)

// install writes the managers' CRDs and webhook configurations, created or
// replaced (the data of an earlier start holds them with that start's ports and
// CA), and waits until the CRDs are served. It returns the number of CRDs.
func install(ctx context.Context, cfg *rest.Config, release clusterapi.Release, kubectl string, managers []clusterapi.Manager, caPEM []byte) (int, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	var webhooks []*unstructured.Unstructured
	for _, m := range managers {
		mc, err := release.CRDs(kubectl, m, caPEM)
		if err != nil {
			return 0, err
		}
		crds = append(crds, mc...)
		wh, err := release.Webhooks(m, caPEM)
		if err != nil {
			return 0, err
		}
		webhooks = append(webhooks, wh...)
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: crds, MaxTime: time.Minute}); err != nil {
		return 0, fmt.Errorf("install the Cluster API CRDs: %w", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return 0, err
	}
	for _, wh := range webhooks {
		if err := createOrReplace(ctx, c, wh); err != nil {
			return 0, fmt.Errorf("create %s %s: %w", wh.GetKind(), wh.GetName(), err)
		}
	}
	return len(crds), nil
}

func createOrReplace(ctx context.Context, c client.Client, obj *unstructured.Unstructured) error {
	old := &unstructured.Unstructured{}
	old.SetGroupVersionKind(obj.GroupVersionKind())
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), old)
	if apierrors.IsNotFound(err) {
		return c.Create(ctx, obj)
	}
	if err != nil {
		return err
	}
	obj.SetResourceVersion(old.GetResourceVersion())
	return c.Update(ctx, obj)
}
