package crds

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldManager owns the fields Install sets.
const FieldManager = "bex"

// Install creates or updates bex's CRDs by server-side apply and waits until the API
// server serves each of them (condition Established). c's scheme must know
// apiextensions/v1. A client that maps bex's kinds must be made after WaitServed:
// discovery lags behind Established.
func Install(ctx context.Context, c client.Client) error {
	all, err := All()
	if err != nil {
		return err
	}
	for _, crd := range all {
		crd.TypeMeta.APIVersion = apiextensionsv1.SchemeGroupVersion.String()
		crd.TypeMeta.Kind = "CustomResourceDefinition"
		crd.ManagedFields = nil
		if err := c.Patch(ctx, crd, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("install CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range all {
		if err := waitEstablished(ctx, c, crd.Name); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, c client.Client, name string) error {
	for {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
			return fmt.Errorf("read CRD %s: %w", name, err)
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
