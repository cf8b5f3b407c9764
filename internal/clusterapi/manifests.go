package clusterapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// CRDs renders the CRDs of m's part of the release as the release installs them
// (kubectl kustomize of its config/crd, with the kubectl at path kubectl: the
// contract labels that tell the core controllers which API version of a
// provider's kind to use, and conversion by webhook), with the conversion webhook
// pointed at m's server on loopback, trusted through caPEM, instead of at the
// Service a cluster would have.
func (r Release) CRDs(kubectl string, m Manager, caPEM []byte) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(r.ModuleDir(m), m.Dir, "config/crd")
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	objs, err := decode(out)
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w", dir, err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, obj := range objs {
		data, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", m.Dir, obj.GetName(), err)
		}
		if c := crd.Spec.Conversion; c != nil && c.Strategy == apiextensionsv1.WebhookConverter && c.Webhook != nil {
			path := "/convert"
			if cc := c.Webhook.ClientConfig; cc != nil && cc.Service != nil && cc.Service.Path != nil {
				path = *cc.Service.Path
			}
			url := m.WebhookURL(path)
			c.Webhook.ClientConfig = &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
		}
		crds = append(crds, crd)
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("%s/config/crd renders no CRD", m.Dir)
	}
	return crds, nil
}

// Webhooks reads the mutating and validating webhook configurations of m's part of
// the release (config/webhook/manifests.yaml) and points them at m's webhook server
// on loopback, trusted through caPEM, instead of at the Service a cluster would
// have. Each is named after m, as a cluster's kustomize prefixes them: every part
// of the release names its own alike.
func (r Release) Webhooks(m Manager, caPEM []byte) ([]*unstructured.Unstructured, error) {
	path := filepath.Join(r.ModuleDir(m), m.Dir, "config/webhook/manifests.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s holds no webhook configuration", path)
	}
	for _, obj := range objs {
		obj.SetName(m.Name + "-" + obj.GetName())
		hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
		for i, h := range hooks {
			h, ok := h.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: %s: a webhook that is no object", path, obj.GetName())
			}
			svcPath, _, _ := unstructured.NestedString(h, "clientConfig", "service", "path")
			h["clientConfig"] = map[string]any{
				"url":      m.WebhookURL(svcPath),
				"caBundle": base64.StdEncoding.EncodeToString(caPEM),
			}
			hooks[i] = h
		}
		if err := unstructured.SetNestedSlice(obj.Object, hooks, "webhooks"); err != nil {
			return nil, err
		}
	}
	return objs, nil
}

// decode decodes a multi-document YAML stream.
func decode(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if m == nil {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}
