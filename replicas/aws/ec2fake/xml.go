package ec2fake

import "encoding/xml"

// The response documents, element for element as the EC2 API Reference's examples show
// them (lowerCamel names, lists as <xSet><item>…</item></xSet>), in the 2016-11-15 namespace.

const namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

type header struct {
	Xmlns     string `xml:"xmlns,attr"`
	RequestID string `xml:"requestId"`
}

func (h *header) set(id string) { h.Xmlns, h.RequestID = namespace, id }

type withHeader interface{ set(string) }

func setRequestID(out any, id string) {
	if h, ok := out.(withHeader); ok {
		h.set(id)
	}
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type placementXML struct {
	AvailabilityZone   string `xml:"availabilityZone"`
	AvailabilityZoneID string `xml:"availabilityZoneId"`
	GroupName          string `xml:"groupName,omitempty"`
	Tenancy            string `xml:"tenancy"`
}

type reasonXML struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type instanceXML struct {
	InstanceID            string       `xml:"instanceId"`
	ImageID               string       `xml:"imageId"`
	State                 stateXML     `xml:"instanceState"`
	PrivateIPAddress      string       `xml:"privateIpAddress,omitempty"`
	Reason                string       `xml:"reason,omitempty"`
	InstanceType          string       `xml:"instanceType"`
	LaunchTime            string       `xml:"launchTime"`
	Placement             placementXML `xml:"placement"`
	InstanceLifecycle     string       `xml:"instanceLifecycle,omitempty"`
	SpotInstanceRequestID string       `xml:"spotInstanceRequestId,omitempty"`
	ClientToken           string       `xml:"clientToken,omitempty"`
	StateReason           *reasonXML   `xml:"stateReason,omitempty"`
	Tags                  []tagXML     `xml:"tagSet>item"`
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type runInstancesResponse struct {
	XMLName xml.Name `xml:"RunInstancesResponse"`
	header
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName xml.Name `xml:"DescribeInstancesResponse"`
	header
	Reservations []reservationXML `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type stateChangeXML struct {
	InstanceID string   `xml:"instanceId"`
	Current    stateXML `xml:"currentState"`
	Previous   stateXML `xml:"previousState"`
}

type terminateInstancesResponse struct {
	XMLName xml.Name `xml:"TerminateInstancesResponse"`
	header
	Instances []stateChangeXML `xml:"instancesSet>item"`
}

type spotStatusXML struct {
	Code       string `xml:"code"`
	UpdateTime string `xml:"updateTime"`
	Message    string `xml:"message"`
}

type spotRequestXML struct {
	ID                   string        `xml:"spotInstanceRequestId"`
	State                string        `xml:"state"`
	Type                 string        `xml:"type"`
	Status               spotStatusXML `xml:"status"`
	InstanceID           string        `xml:"instanceId"`
	LaunchedZone         string        `xml:"launchedAvailabilityZone"`
	LaunchedZoneID       string        `xml:"launchedAvailabilityZoneId"`
	ProductDescription   string        `xml:"productDescription"`
	InterruptionBehavior string        `xml:"instanceInterruptionBehavior"`
	Tags                 []tagXML      `xml:"tagSet>item"`
}

type describeSpotRequestsResponse struct {
	XMLName xml.Name `xml:"DescribeSpotInstanceRequestsResponse"`
	header
	Requests []spotRequestXML `xml:"spotInstanceRequestSet>item"`
}

type spotPriceXML struct {
	InstanceType       string `xml:"instanceType"`
	ProductDescription string `xml:"productDescription"`
	SpotPrice          string `xml:"spotPrice"`
	Timestamp          string `xml:"timestamp"`
	AvailabilityZone   string `xml:"availabilityZone"`
	AvailabilityZoneID string `xml:"availabilityZoneId"`
}

type describeSpotPricesResponse struct {
	XMLName xml.Name `xml:"DescribeSpotPriceHistoryResponse"`
	header
	Prices    []spotPriceXML `xml:"spotPriceHistorySet>item"`
	NextToken string         `xml:"nextToken"`
}

type zoneXML struct {
	ZoneName    string `xml:"zoneName"`
	State       string `xml:"zoneState"`
	RegionName  string `xml:"regionName"`
	ZoneID      string `xml:"zoneId"`
	ZoneType    string `xml:"zoneType"`
	OptInStatus string `xml:"optInStatus"`
	GroupName   string `xml:"groupName"`
}

type describeZonesResponse struct {
	XMLName xml.Name `xml:"DescribeAvailabilityZonesResponse"`
	header
	Zones []zoneXML `xml:"availabilityZoneInfo>item"`
}

type imageXML struct {
	ImageID        string `xml:"imageId"`
	Name           string `xml:"name"`
	CreationDate   string `xml:"creationDate"`
	State          string `xml:"imageState"`
	Architecture   string `xml:"architecture"`
	OwnerID        string `xml:"imageOwnerId"`
	OwnerAlias     string `xml:"imageOwnerAlias"`
	RootDeviceName string `xml:"rootDeviceName"`
	RootDeviceType string `xml:"rootDeviceType"`
}

type describeImagesResponse struct {
	XMLName xml.Name `xml:"DescribeImagesResponse"`
	header
	Images []imageXML `xml:"imagesSet>item"`
}
