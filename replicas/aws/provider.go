// Package aws is the provider that runs replicas on EC2 instances through the official SDK
// (github.com/aws/aws-sdk-go-v2): one instance per replica, spot or on-demand, in the zone
// and instance type placement chose, started by a cloud-init script that runs the spec's
// setup and run. Every instance carries the control plane's tags, which are all that finds
// it again after a crash.
//
// It lives in its own package so that only the binaries that run a control plane link the
// AWS SDK.
package aws

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/singleflight"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
)

// Tags on every instance (and its volumes and spot request).
const (
	TagOwner    = "arbiter:owner"
	TagService  = "arbiter:service"
	TagVersion  = "arbiter:version"
	TagReplica  = "arbiter:replica"
	TagZone     = "arbiter:zone" // the zone as placement named it (AZ id or name)
	TagPrice    = "arbiter:price-per-hour"
	TagPort     = "arbiter:port"
	TagSource   = "arbiter:price-source"
	tagName     = "Name"
	maxNotFound = 2 * time.Minute
)

// liveStates are the instance states that may still cost money or come back.
var liveStates = []string{"pending", "running", "stopping", "stopped"}

// Provider runs replicas as EC2 instances in one account. It implements replicas.Provider.
type Provider struct {
	cfg     Config
	base    aws.Config
	notices *replicas.Notifier
	catalog func() (*pricing.Catalog, error)

	mu      sync.Mutex
	clients map[string]*ec2.Client // by region
	images  map[string]ami         // region|image id or name → the image
	zones   map[string]zoneMap     // region → its zones
	spot    map[string]spotPrices  // region → spot prices
	// launched: instances this process created, by handle, with when: EC2 may not know
	// them yet (eventual consistency), which is not the same as gone.
	launched map[string]time.Time
	// spotReqs: this owner's spot instances, by handle, to watch for interruption notices.
	spotReqs map[string]spotWatch
	// members: the instances of multi-node replicas, by instance handle (group.go).
	members map[string]member
	// s3 is the staging bucket's client; staged the workdirs this process uploaded, by
	// service, version and folder (workdir.go), staging the uploads under way.
	s3      *s3.Client
	staged  map[string]stagedWorkdir
	staging singleflight.Group
}

type spotWatch struct {
	replicaID, requestID string
}

var _ replicas.Provider = (*Provider)(nil)

// New returns the provider and starts watching for spot interruptions until ctx ends. It
// loads the SDK's configuration (credentials, region) but calls nothing: a region that
// cannot be reached is reported by the calls that need it.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Owner == "" {
		return nil, errors.New("aws provider: an owner is required")
	}
	if err := cfg.Account.Check(); err != nil {
		return nil, fmt.Errorf("aws provider: %w", err)
	}
	cfg.defaults()
	var opts []func(*config.LoadOptions) error
	if cfg.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(cfg.Profile))
	}
	base, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("aws provider: load the SDK's configuration: %w", err)
	}
	if len(cfg.Regions) == 0 {
		if base.Region == "" {
			return nil, errors.New("aws provider: no region: give regions in the providers file, or AWS_REGION, or a region in the profile")
		}
		cfg.Regions = []string{base.Region}
	}
	p := &Provider{cfg: cfg, base: base, notices: replicas.NewNotifier(64),
		clients: map[string]*ec2.Client{}, images: map[string]ami{}, zones: map[string]zoneMap{}, spot: map[string]spotPrices{},
		launched: map[string]time.Time{}, spotReqs: map[string]spotWatch{}, members: map[string]member{}, staged: map[string]stagedWorkdir{}}
	p.catalog = sync.OnceValues(cfg.Catalog)
	for region := range cfg.InterruptionQueues {
		if !p.servesRegion(region) {
			return nil, fmt.Errorf("aws provider: interruption_queues: %s is not one of the provider's regions (%s)", region, strings.Join(cfg.Regions, ", "))
		}
	}
	go p.watchSpot(ctx)
	for region, url := range cfg.InterruptionQueues {
		go p.watchQueue(ctx, region, url)
	}
	return p, nil
}

// Name implements replicas.Provider.
func (p *Provider) Name() string { return ProviderName }

// Setup implements replicas.Provider: each instance runs the setup in its own script.
func (p *Provider) Setup(context.Context, string, int, string, string, map[string]string) error {
	return nil
}

// Notices implements replicas.Provider.
func (p *Provider) Notices() <-chan replicas.Notice { return p.notices.C() }

func (p *Provider) client(region string) (*ec2.Client, error) {
	if !p.servesRegion(region) {
		return nil, fmt.Errorf("aws: region %q is not one of the provider's (%s)", region, strings.Join(p.cfg.Regions, ", "))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[region]; c != nil {
		return c, nil
	}
	c := ec2.NewFromConfig(p.base, func(o *ec2.Options) {
		o.Region = region
		if p.cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(p.cfg.Endpoint)
		}
		// EC2 answers capacity refusals with HTTP 500, which the standard retryer retries
		// (with backoff) as a server fault; asking the same zone again at once does not
		// make capacity appear, and placement has other zones to try.
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
				if capacityCodes[errorCode(err)] {
					return aws.FalseTernary
				}
				return aws.UnknownTernary
			})}, so.Retryables...)
		})
	})
	p.clients[region] = c
	return c, nil
}

func (p *Provider) servesRegion(region string) bool { return slices.Contains(p.cfg.Regions, region) }

// A handle is region/instance-id: an id alone does not say which regional endpoint knows it.
func handleOf(region, id string) string { return region + "/" + id }

func splitHandle(h string) (region, id string, err error) {
	region, id, ok := strings.Cut(h, "/")
	if !ok || !strings.HasPrefix(id, "i-") {
		return "", "", fmt.Errorf("aws: %q is not an instance handle (region/i-…)", h)
	}
	return region, id, nil
}

// clientToken makes RunInstances idempotent for one replica: a launch retried after a
// timeout or a crash gets the instance the first call made, never a second one
// (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html). At most 64
// ASCII characters.
func (p *Provider) clientToken(replicaID string) string {
	sum := sha256.Sum256([]byte(p.cfg.Owner + "/" + replicaID))
	return "arbiter-" + hex.EncodeToString(sum[:20])
}

// Launch implements replicas.Provider: RunInstances in the zone, instance type and capacity
// of the quote placement took, then waits until the instance runs and has an address.
func (p *Provider) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	region := cmp.Or(ls.Region, p.cfg.Regions[0])
	what := fmt.Sprintf("aws: launch %s (%s %s in %s)", ls.ReplicaID, ls.Capacity, cmp.Or(ls.InstanceType, "?"), cmp.Or(ls.Zone, region))
	if ls.InstanceType == "" {
		return replicas.Instance{}, fmt.Errorf("%s: no instance type: launches on aws come from a quote", what)
	}
	if ls.Image != "" && !strings.HasPrefix(ls.Image, "ami-") {
		return replicas.Instance{}, fmt.Errorf("%s: resources.image_id %q: the aws provider boots AMIs (ami-…); container images are not supported on it yet", what, ls.Image)
	}
	c, err := p.client(region)
	if err != nil {
		return replicas.Instance{}, err
	}
	image, err := p.image(ctx, region, c, ls.Image)
	if err != nil {
		return replicas.Instance{}, fmt.Errorf("%s: %w", what, err)
	}
	port := ls.Port
	if port == 0 {
		port = DefaultPort
	}
	price := 0.0
	if ls.PricePerHour != nil {
		price = *ls.PricePerHour
	}
	wd, err := p.workdirFor(ctx, ls)
	if err != nil {
		return replicas.Instance{}, fmt.Errorf("%s: %w", what, err)
	}
	if ls.Nodes() > 1 {
		return p.launchGroup(ctx, c, ls, region, image, port, price, what, wd)
	}
	script, err := userData(ls, port, 0, wd)
	if err != nil {
		return replicas.Instance{}, err
	}
	in := p.runInput(ls, image, script, price, port)
	out, err := p.runInstances(ctx, c, in)
	if err != nil {
		return replicas.Instance{}, classify(err, what)
	}
	if len(out.Instances) != 1 || out.Instances[0].InstanceId == nil {
		return replicas.Instance{}, fmt.Errorf("%s: RunInstances answered %d instances", what, len(out.Instances))
	}
	id := aws.ToString(out.Instances[0].InstanceId)
	handle := handleOf(region, id)
	p.mu.Lock()
	p.launched[handle] = p.cfg.Now()
	p.mu.Unlock()
	p.cfg.Log.Info("aws instance launched", "replica", ls.ReplicaID, "instance", id, "region", region, "zone", ls.Zone,
		"type", ls.InstanceType, "capacity", ls.Capacity)
	inst, err := p.awaitRunning(ctx, c, region, id)
	if err != nil {
		// Not left behind: a replica that never ran is terminated before the error is said.
		p.terminateQuietly(c, id)
		return replicas.Instance{}, fmt.Errorf("%s: instance %s: %w", what, id, err)
	}
	return inst, nil
}

// runInput is the RunInstances call of one instance of a replica: its image, type, zone,
// user data, tags, disk and market.
func (p *Provider) runInput(ls replicas.LaunchSpec, image ami, script string, price float64, port int) *ec2.RunInstancesInput {
	in := &ec2.RunInstancesInput{
		ImageId:      aws.String(image.id),
		InstanceType: types.InstanceType(ls.InstanceType),
		MinCount:     aws.Int32(1),
		MaxCount:     aws.Int32(1),
		ClientToken:  aws.String(p.clientToken(ls.ReplicaID)),
		UserData:     aws.String(base64.StdEncoding.EncodeToString([]byte(script))),
		// A replica that shuts itself down is gone, not a stopped instance still billed for
		// its volume.
		InstanceInitiatedShutdownBehavior: types.ShutdownBehaviorTerminate,
		TagSpecifications:                 p.tagSpecs(ls, price, port),
	}
	if ls.Zone != "" {
		in.Placement = &types.Placement{}
		if isZoneID(ls.Zone) {
			in.Placement.AvailabilityZoneId = aws.String(ls.Zone)
		} else {
			in.Placement.AvailabilityZone = aws.String(ls.Zone)
		}
	}
	if subnet := p.cfg.Subnets[ls.Zone]; subnet != "" {
		in.SubnetId = aws.String(subnet)
		in.Placement = nil // the subnet is in one zone: it places the instance
	}
	if len(p.cfg.SecurityGroups) > 0 {
		in.SecurityGroupIds = p.cfg.SecurityGroups
	}
	if p.cfg.KeyName != "" {
		in.KeyName = aws.String(p.cfg.KeyName)
	}
	if ip := p.cfg.InstanceProfile; ip != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: aws.String(ip)}
		if strings.HasPrefix(ip, "arn:") {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Arn: aws.String(ip)}
		}
	}
	if disk := cmp.Or(ls.DiskGiB, p.cfg.DiskGiB); disk > 0 {
		// The root volume, by the image's own root device name (Ubuntu's /dev/sda1, Amazon
		// Linux's /dev/xvda): a mapping under another name would add a second volume.
		in.BlockDeviceMappings = []types.BlockDeviceMapping{{DeviceName: aws.String(image.rootDevice),
			Ebs: &types.EbsBlockDevice{VolumeSize: aws.Int32(int32(disk)), VolumeType: types.VolumeTypeGp3, DeleteOnTermination: aws.Bool(true)}}}
	}
	if ls.Capacity == fleet.Spot {
		// One-time, terminated on interruption: a replaced replica is a new launch, never a
		// stopped instance that comes back on its own.
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{SpotInstanceType: types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate}}
	}
	return in
}

// runInstances calls RunInstances, and again with the same client token when the first
// call's outcome is unknown (a timeout or a dropped connection): EC2 then answers with the
// instance the first call made.
func (p *Provider) runInstances(ctx context.Context, c *ec2.Client, in *ec2.RunInstancesInput) (*ec2.RunInstancesOutput, error) {
	var err error
	for try := range 3 {
		var out *ec2.RunInstancesOutput
		if out, err = c.RunInstances(ctx, in); err == nil || errorCode(err) != "" || ctx.Err() != nil {
			return out, err
		}
		p.cfg.Log.Warn("aws RunInstances outcome unknown; asking again with the same client token", "try", try+1, "err", err)
	}
	return nil, err
}

func (p *Provider) tagSpecs(ls replicas.LaunchSpec, price float64, port int) []types.TagSpecification {
	tags := []types.Tag{
		{Key: aws.String(TagOwner), Value: aws.String(p.cfg.Owner)},
		{Key: aws.String(TagService), Value: aws.String(ls.Service)},
		{Key: aws.String(TagVersion), Value: aws.String(strconv.Itoa(ls.Version))},
		{Key: aws.String(TagReplica), Value: aws.String(ls.ReplicaID)},
		{Key: aws.String(TagZone), Value: aws.String(ls.Zone)},
		{Key: aws.String(TagPrice), Value: aws.String(strconv.FormatFloat(price, 'g', -1, 64))},
		{Key: aws.String(TagPort), Value: aws.String(strconv.Itoa(port))},
		{Key: aws.String(TagSource), Value: aws.String(ls.PriceSource)},
		{Key: aws.String(tagName), Value: aws.String("arbiter-" + ls.Service + "-" + ls.ReplicaID)},
	}
	specs := []types.TagSpecification{
		{ResourceType: types.ResourceTypeInstance, Tags: tags},
		{ResourceType: types.ResourceTypeVolume, Tags: tags},
	}
	if ls.Capacity == fleet.Spot {
		specs = append(specs, types.TagSpecification{ResourceType: types.ResourceTypeSpotInstancesRequest, Tags: tags})
	}
	return specs
}

// awaitRunning polls until the instance runs with an address, is gone (a spot instance
// reclaimed at once, capacity that vanished), or StartSeconds pass.
func (p *Provider) awaitRunning(ctx context.Context, c *ec2.Client, region, id string) (replicas.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, seconds(p.cfg.StartSeconds))
	defer cancel()
	start := p.cfg.Now()
	for {
		inst, err := p.describe(ctx, c, id)
		switch {
		case notFound(err) && p.cfg.Now().Sub(start) < p.cfg.NotFoundGrace:
			// Just created: DescribeInstances may not know it for a few seconds.
		case err != nil:
			return replicas.Instance{}, classify(err, "describe")
		default:
			state := inst.State.Name
			switch state {
			case types.InstanceStateNameRunning:
				if in := p.instance(region, inst); in.Address != "" {
					p.watch(region, inst)
					return in, nil
				}
			case types.InstanceStateNamePending:
			default:
				code, msg := stateReason(inst)
				err := fmt.Errorf("went %s before it ran: %s: %s", state, code, msg)
				if code == "Server.SpotInstanceTermination" || code == "Server.InsufficientInstanceCapacity" {
					err = fmt.Errorf("%w: %v", replicas.ErrNoCapacity, err)
				}
				return replicas.Instance{}, err
			}
		}
		select {
		case <-ctx.Done():
			return replicas.Instance{}, fmt.Errorf("not running with an address after %s: %w", p.cfg.Now().Sub(start).Round(time.Second), ctx.Err())
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

func stateReason(inst types.Instance) (code, msg string) {
	if r := inst.StateReason; r != nil {
		return aws.ToString(r.Code), aws.ToString(r.Message)
	}
	return "", aws.ToString(inst.StateTransitionReason)
}

func (p *Provider) describe(ctx context.Context, c *ec2.Client, id string) (types.Instance, error) {
	out, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return types.Instance{}, err
	}
	for _, r := range out.Reservations {
		for _, inst := range r.Instances {
			if aws.ToString(inst.InstanceId) == id {
				return inst, nil
			}
		}
	}
	return types.Instance{}, fmt.Errorf("DescribeInstances did not list %s", id)
}

func tagsOf(inst types.Instance) map[string]string {
	m := make(map[string]string, len(inst.Tags))
	for _, t := range inst.Tags {
		m[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return m
}

// instance is a replica as the provider reports it, read from the instance's tags and state.
func (p *Provider) instance(region string, inst types.Instance) replicas.Instance {
	tags := tagsOf(inst)
	in := replicas.Instance{ReplicaID: tags[TagReplica], Handle: handleOf(region, aws.ToString(inst.InstanceId)),
		Capacity: fleet.OnDemand, Region: region, Zone: tags[TagZone]}
	if inst.InstanceLifecycle == types.InstanceLifecycleTypeSpot {
		in.Capacity = fleet.Spot
	}
	if in.Zone == "" && inst.Placement != nil {
		in.Zone = cmp.Or(aws.ToString(inst.Placement.AvailabilityZoneId), aws.ToString(inst.Placement.AvailabilityZone))
	}
	in.PricePerHour, _ = strconv.ParseFloat(tags[TagPrice], 64)
	in.PriceSource = tags[TagSource]
	ip := aws.ToString(inst.PrivateIpAddress)
	if p.cfg.PublicIP {
		ip = aws.ToString(inst.PublicIpAddress)
	}
	if ip != "" {
		in.Address = net.JoinHostPort(ip, cmp.Or(tags[TagPort], strconv.Itoa(DefaultPort)))
	}
	return in
}

// watch remembers a spot instance's request, for interruption notices.
func (p *Provider) watch(region string, inst types.Instance) {
	if inst.InstanceLifecycle != types.InstanceLifecycleTypeSpot {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spotReqs[handleOf(region, aws.ToString(inst.InstanceId))] = spotWatch{replicaID: tagsOf(inst)[TagReplica], requestID: aws.ToString(inst.SpotInstanceRequestId)}
}

// List implements replicas.Provider: every live instance tagged with this owner, in every
// region of the provider.
func (p *Provider) List(ctx context.Context) ([]replicas.Instance, error) {
	var out []replicas.Instance
	for _, region := range p.cfg.Regions {
		c, err := p.client(region)
		if err != nil {
			return nil, err
		}
		var found []types.Instance
		pages := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{Filters: []types.Filter{
			{Name: aws.String("tag:" + TagOwner), Values: []string{p.cfg.Owner}},
			{Name: aws.String("instance-state-name"), Values: liveStates},
		}})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				return nil, classify(err, "aws: list instances in "+region)
			}
			for _, r := range page.Reservations {
				for _, inst := range r.Instances {
					found = append(found, inst)
					p.watch(region, inst)
				}
			}
		}
		// A multi-node replica's instances are one replica.
		out = append(out, p.groupInstances(region, found)...)
	}
	return out, nil
}

// Status implements replicas.Provider.
func (p *Provider) Status(ctx context.Context, handle string) (replicas.Status, string, error) {
	if region, ids, _, ok := splitGroup(handle); ok {
		return p.statusGroup(ctx, region, ids)
	}
	region, id, err := splitHandle(handle)
	if err != nil {
		return "", "", err
	}
	c, err := p.client(region)
	if err != nil {
		return "", "", err
	}
	inst, err := p.describe(ctx, c, id)
	if notFound(err) {
		p.mu.Lock()
		at, ok := p.launched[handle]
		p.mu.Unlock()
		if ok && p.cfg.Now().Sub(at) < p.cfg.NotFoundGrace {
			return replicas.StatusRunning, "", nil // just created: not listed yet
		}
		return replicas.StatusGone, "EC2 no longer knows the instance", nil
	}
	if err != nil {
		return "", "", classify(err, "aws: status of "+handle)
	}
	switch inst.State.Name {
	case types.InstanceStateNamePending, types.InstanceStateNameRunning:
		return replicas.StatusRunning, "", nil
	}
	code, msg := stateReason(inst)
	return replicas.StatusGone, strings.TrimSpace(fmt.Sprintf("%s (%s: %s)", inst.State.Name, code, msg)), nil
}

// Terminate implements replicas.Provider: TerminateInstances, then waits until EC2 says
// terminated (or no longer knows the instance). A multi-node replica's instances are all
// terminated, then its placement group deleted.
func (p *Provider) Terminate(ctx context.Context, handle string) error {
	if region, ids, group, ok := splitGroup(handle); ok {
		return p.terminateGroup(ctx, handle, region, ids, group)
	}
	region, id, err := splitHandle(handle)
	if err != nil {
		return err
	}
	c, err := p.client(region)
	if err != nil {
		return err
	}
	if _, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil && !notFound(err) {
		return classify(err, "aws: terminate "+handle)
	}
	for {
		inst, err := p.describe(ctx, c, id)
		if notFound(err) || (err == nil && inst.State.Name == types.InstanceStateNameTerminated) {
			p.forget(handle)
			return nil
		}
		if err != nil && ctx.Err() == nil {
			p.cfg.Log.Warn("aws: waiting for termination", "instance", handle, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("aws: terminate %s: not terminated yet: %w", handle, ctx.Err())
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

func (p *Provider) forget(handle string) {
	p.mu.Lock()
	delete(p.launched, handle)
	delete(p.spotReqs, handle)
	p.mu.Unlock()
	p.notices.Forget(handle)
}

// terminateQuietly terminates an instance a launch gave up on, on its own deadline (the
// launch's context may be what ended).
func (p *Provider) terminateQuietly(c *ec2.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil && !notFound(err) {
		p.cfg.Log.Error("aws: cannot terminate an instance whose launch failed; List will find it by its tags", "instance", id, "err", err)
	}
}

// ami is an image to boot and the name of its root device.
type ami struct{ id, rootDevice string }

// image resolves the AMI a replica boots: the spec's (ami-…), else the account's, which is
// an id or the newest image whose name matches its pattern. Cached per region and name.
func (p *Provider) image(ctx context.Context, region string, c *ec2.Client, fromSpec string) (ami, error) {
	want := cmp.Or(fromSpec, p.cfg.Image)
	key := region + "|" + want
	p.mu.Lock()
	im, ok := p.images[key]
	p.mu.Unlock()
	if ok {
		return im, nil
	}
	in := &ec2.DescribeImagesInput{}
	if strings.HasPrefix(want, "ami-") {
		in.ImageIds = []string{want}
	} else {
		in.Owners = p.cfg.ImageOwners
		in.Filters = []types.Filter{
			{Name: aws.String("name"), Values: []string{want}},
			{Name: aws.String("state"), Values: []string{"available"}},
			{Name: aws.String("architecture"), Values: []string{"x86_64"}},
		}
	}
	out, err := c.DescribeImages(ctx, in)
	if err != nil {
		return ami{}, classify(err, "find the image "+want)
	}
	var newest types.Image
	for _, im := range out.Images {
		// CreationDate is RFC 3339, so text order is time order.
		if aws.ToString(im.CreationDate) >= aws.ToString(newest.CreationDate) {
			newest = im
		}
	}
	if newest.ImageId == nil {
		return ami{}, fmt.Errorf("no image %q (owners %s) in %s; set image in the providers file, or resources.image_id: ami-… in the spec",
			want, strings.Join(p.cfg.ImageOwners, ", "), region)
	}
	im = ami{id: aws.ToString(newest.ImageId), rootDevice: cmp.Or(aws.ToString(newest.RootDeviceName), "/dev/sda1")}
	p.mu.Lock()
	p.images[key] = im
	p.mu.Unlock()
	return im, nil
}

// isZoneID tells an AZ id (use1-az1, the same zone in every account) from a zone name
// (us-east-1a, which each account maps to its own zone).
func isZoneID(z string) bool { return strings.Contains(z, "-az") }

// Regions are the regions the provider quotes and launches in.
func (p *Provider) Regions() []string { return slices.Clone(p.cfg.Regions) }
