// Package coreclient talks to a cluster's core/v1 API (pods, nodes, namespaces, service
// accounts) through client-go's REST client and informers, with a scheme that holds core/v1
// alone.
//
// client-go's clientset would do the same, but it registers every one of the API's 56
// groups: linking it tripled the time to build the binaries that run a control plane,
// for the two kinds the provider uses.
package coreclient

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Resources of core/v1, as the API's paths name them.
const (
	Pods            = "pods"
	Nodes           = "nodes"
	Namespaces      = "namespaces"
	ServiceAccounts = "serviceaccounts"
)

// Client reaches one cluster's core/v1 API. A namespace of "" means a cluster-scoped
// resource (nodes, namespaces) or, for a list, every namespace.
type Client struct {
	rest   *rest.RESTClient
	params runtime.ParameterCodec
}

// New returns a client for cfg (which it does not modify). groups registers further API
// groups whose objects travel as bodies of core/v1 calls (authentication/v1's
// TokenRequest for a service account's token).
func New(cfg *rest.Config, groups ...func(*runtime.Scheme) error) (*Client, error) {
	scheme := runtime.NewScheme()
	for _, add := range append([]func(*runtime.Scheme) error{corev1.AddToScheme}, groups...) {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("kubernetes scheme: %w", err)
		}
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return &Client{rest: rc, params: runtime.NewParameterCodec(scheme)}, nil
}

// Ready asks the apiserver's /readyz: nil when it answers that it serves.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.rest.Get().AbsPath("/readyz").DoRaw(ctx)
	return err
}

// on starts a request on resource in namespace; the REST client refuses an empty
// namespace next to a name, which is how cluster-scoped objects are addressed.
func on(r *rest.Request, resource, namespace string) *rest.Request {
	if namespace != "" {
		r = r.Namespace(namespace)
	}
	return r.Resource(resource)
}

// Get reads one object into into.
func (c *Client) Get(ctx context.Context, resource, namespace, name string, into runtime.Object) error {
	return on(c.rest.Get(), resource, namespace).Name(name).Do(ctx).Into(into)
}

// List reads the objects that opts select into into (a list type: *corev1.PodList…).
func (c *Client) List(ctx context.Context, resource, namespace string, opts metav1.ListOptions, into runtime.Object) error {
	return on(c.rest.Get(), resource, namespace).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(into)
}

// Create creates obj and reads what the apiserver stored into into.
func (c *Client) Create(ctx context.Context, resource, namespace string, obj, into runtime.Object) error {
	return on(c.rest.Post(), resource, namespace).Body(obj).Do(ctx).Into(into)
}

// CreateSub posts obj to a subresource of name (a service account's token) and reads the
// answer into into.
func (c *Client) CreateSub(ctx context.Context, resource, namespace, name, sub string, obj, into runtime.Object) error {
	return on(c.rest.Post(), resource, namespace).Name(name).SubResource(sub).Body(obj).Do(ctx).Into(into)
}

// Update replaces an object (its resourceVersion guards against a lost update) and reads
// the result into into. sub is "" or a subresource ("status").
func (c *Client) Update(ctx context.Context, resource, namespace, name, sub string, obj, into runtime.Object) error {
	r := on(c.rest.Put(), resource, namespace).Name(name)
	if sub != "" {
		r = r.SubResource(sub)
	}
	return r.Body(obj).Do(ctx).Into(into)
}

// MergePatch applies a JSON merge patch (RFC 7386) to an object and reads the result into
// into: a change to a few keys (annotations) that needs no read first and meets no conflict.
func (c *Client) MergePatch(ctx context.Context, resource, namespace, name string, patch []byte, into runtime.Object) error {
	return on(c.rest.Patch(types.MergePatchType), resource, namespace).Name(name).Body(patch).Do(ctx).Into(into)
}

// Delete deletes one object as opts say (grace period, preconditions).
func (c *Client) Delete(ctx context.Context, resource, namespace, name string, opts metav1.DeleteOptions) error {
	return on(c.rest.Delete(), resource, namespace).Name(name).Body(&opts).Do(ctx).Error()
}

// Logs reads a pod's container output as opts select it.
func (c *Client) Logs(ctx context.Context, namespace, pod string, opts *corev1.PodLogOptions) ([]byte, error) {
	return on(c.rest.Get(), Pods, namespace).Name(pod).SubResource("log").VersionedParams(opts, c.params).DoRaw(ctx)
}

// Informer watches resource in namespace ("" for all) into a cache indexed by namespace;
// tweak narrows what it lists and watches (a label selector). example is one object of the
// kind (&corev1.Pod{}). Start it with Run.
func (c *Client) Informer(resource, namespace string, example runtime.Object, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := cache.NewFilteredListWatchFromClient(c.rest, resource, namespace, tweak)
	return cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// Objects of an API group this client has no Go types registered for (a custom
// resource: LeaderWorkerSet) travel as JSON to and from plain structs. groupVersion is
// "group/version" as /apis/ names it.

// Serves reports whether the apiserver serves resource in groupVersion, by discovery
// (GET /apis/<groupVersion>): false, without error, where the group is not installed.
func (c *Client) Serves(ctx context.Context, groupVersion, resource string) (bool, error) {
	b, err := c.rest.Get().AbsPath("/apis", groupVersion).DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(b, &list); err != nil {
		return false, fmt.Errorf("discovery of %s: %w", groupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

// groupPath is a resource of groupVersion in namespace ("": a cluster-scoped resource,
// or every namespace), or one object of it.
func groupPath(groupVersion, resource, namespace string, name ...string) []string {
	if namespace == "" {
		return append([]string{"/apis", groupVersion, resource}, name...)
	}
	return append([]string{"/apis", groupVersion, "namespaces", namespace, resource}, name...)
}

// decode decodes a JSON answer into into (nil: the answer is dropped).
func decode(b []byte, err error, into any) error {
	if err != nil || into == nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// CreateJSON creates obj (any value that marshals to the resource's JSON) as resource of
// groupVersion in namespace and decodes what the apiserver stored into into.
func (c *Client) CreateJSON(ctx context.Context, groupVersion, resource, namespace string, obj, into any) error {
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	b, err := c.rest.Post().AbsPath(groupPath(groupVersion, resource, namespace)...).SetHeader("Content-Type", "application/json").Body(body).DoRaw(ctx)
	return decode(b, err, into)
}

// GetJSON reads one object of resource of groupVersion into into.
func (c *Client) GetJSON(ctx context.Context, groupVersion, resource, namespace, name string, into any) error {
	b, err := c.rest.Get().AbsPath(groupPath(groupVersion, resource, namespace, name)...).DoRaw(ctx)
	return decode(b, err, into)
}

// ListJSON reads every object of resource of groupVersion in namespace into into (a
// struct with an Items slice).
func (c *Client) ListJSON(ctx context.Context, groupVersion, resource, namespace string, into any) error {
	b, err := c.rest.Get().AbsPath(groupPath(groupVersion, resource, namespace)...).DoRaw(ctx)
	return decode(b, err, into)
}

// DeleteJSON deletes one object of resource of groupVersion as opts say.
func (c *Client) DeleteJSON(ctx context.Context, groupVersion, resource, namespace, name string, opts metav1.DeleteOptions) error {
	body, err := json.Marshal(opts)
	if err != nil {
		return err
	}
	_, err = c.rest.Delete().AbsPath(groupPath(groupVersion, resource, namespace, name)...).SetHeader("Content-Type", "application/json").Body(body).DoRaw(ctx)
	return err
}
