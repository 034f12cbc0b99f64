/* Hostile use of the C ABI's ROS 2 functions: null arguments, null, stale and made-up
 * handles, double drops, use after drop, names that are not ROS names, QoS values out
 * of range, image fields and tensor descriptions that do not fit their data, a handle
 * of one message type used for the other. Every call must return the documented error
 * (never crash), with a message, and a refused call must lose nothing (its out-
 * parameters and loans untouched). Between the refusals, one image and one tensor go
 * through a publisher and a subscription of this process and are checked field by
 * field. Built with AddressSanitizer by tests/ros_abi.rs; exits 1 if anything
 * surprised it. Argument: a Zenoh JSON5 configuration (an isolated peer). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <zenoh_cuda_shm.h>

#include "expect.h"

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Waits up to 10 s until the publisher knows one subscription of ours. */
static void wait_ours(zcs_ros_publisher_t p) {
    size_t ours = 0;
    for (int i = 0; i < 1000 && ours == 0; i++) {
        EXPECT(zcs_ros_publisher_subscriptions(p, &ours, NULL), ZCS_OK);
        if (ours == 0) sleep_ms(10);
    }
    CHECK(ours == 1);
}

int main(int argc, char **argv) {
    const char *zenoh = argc > 1 ? argv[1] : "{mode: \"peer\", scouting: {multicast: {enabled: false}}}";
    zcs_session_t null_session = {0};
    zcs_ros_node_t null_node = {0};
    zcs_ros_publisher_t null_pub = {0};
    zcs_ros_subscriber_t null_sub = {0};
    zcs_ros_sample_t null_sample = {0};
    zcs_loan_t loan = {0};
    zcs_ros_qos_t qos;
    int64_t seq = 0;
    size_t n = 0;
    const char *str = NULL;
    uint8_t data[64];
    memset(data, 0x5a, sizeof data);

    /* QoS constructors. */
    EXPECT(zcs_ros_qos_default(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_qos_sensor_data(&qos), ZCS_OK);
    CHECK(qos.reliability == ZCS_ROS_RELIABILITY_BEST_EFFORT && qos.durability == ZCS_ROS_DURABILITY_VOLATILE &&
          qos.history == ZCS_ROS_HISTORY_KEEP_LAST && qos.depth == 5);
    EXPECT(zcs_ros_qos_default(&qos), ZCS_OK);
    CHECK(qos.reliability == ZCS_ROS_RELIABILITY_RELIABLE && qos.durability == ZCS_ROS_DURABILITY_VOLATILE &&
          qos.history == ZCS_ROS_HISTORY_KEEP_LAST && qos.depth == 10);

    /* Null handles and pointers, before anything exists. */
    zcs_ros_node_t node = {0};
    EXPECT(zcs_ros_node_create(null_session, "n", NULL, 3, &node), ZCS_ERR_STALE);
    EXPECT(zcs_ros_node_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_node_drop(&null_node), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_subscriber_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_sample_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_declare_image(null_node, "/t", NULL, &null_pub), ZCS_ERR_STALE);
    EXPECT(zcs_ros_subscriber_declare_tensor(null_node, "/t", NULL, &null_sub), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_loan(null_pub, 8, &loan), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_subscriptions(null_pub, &n, NULL), ZCS_ERR_STALE);
    EXPECT(zcs_ros_subscriber_recv(null_sub, 0, &null_sample), ZCS_ERR_STALE);
    EXPECT(zcs_ros_sample_data_len(null_sample, &n), ZCS_ERR_STALE);
    EXPECT(zcs_ros_sample_attachment(null_sample, &seq, NULL, NULL), ZCS_ERR_STALE);

    /* A node: bad names refused, out untouched. */
    zcs_session_t s = {0};
    EXPECT(zcs_session_open(zenoh, "{device: \"host\"}", &s), ZCS_OK);
    EXPECT(zcs_ros_node_create(s, NULL, NULL, 3, &node), ZCS_ERR_NULL);
    EXPECT(zcs_ros_node_create(s, "n", NULL, 3, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_node_create(s, "1node", NULL, 3, &node), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_node_create(s, "a/b", NULL, 3, &node), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_node_create(s, "n", "relative", 3, &node), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_node_create(s, "n", "/a//b", 3, &node), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_node_create(s, "n\xff", NULL, 3, &node), ZCS_ERR_INVALID);
    CHECK(node.id == 0);
    EXPECT(zcs_ros_node_create(s, "hostile", "/zcs", 3, &node), ZCS_OK);
    uint32_t domain = 0;
    EXPECT(zcs_ros_node_domain(node, &domain), ZCS_OK);
    CHECK(domain == 3);
    EXPECT(zcs_ros_node_domain(node, NULL), ZCS_ERR_NULL);

    /* Topics that are not ROS names, QoS values out of range; out untouched. */
    zcs_ros_publisher_t ip = {0}, tp = {0};
    EXPECT(zcs_ros_publisher_declare_image(node, NULL, NULL, &ip), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_declare_image(node, "/t", NULL, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_declare_image(node, "1camera", NULL, &ip), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_declare_image(node, "camera//image", NULL, &ip), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_declare_image(node, "camera/", NULL, &ip), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_declare_image(node, "cam era", NULL, &ip), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_declare_image(node, "", NULL, &ip), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_subscriber_declare_image(node, "~x", NULL, &null_sub), ZCS_ERR_INVALID);
    zcs_ros_qos_t bad = qos;
    bad.reliability = 0;
    EXPECT(zcs_ros_publisher_declare_image(node, "image", &bad, &ip), ZCS_ERR_INVALID);
    bad = qos;
    bad.durability = 7;
    EXPECT(zcs_ros_publisher_declare_tensor(node, "tensor", &bad, &tp), ZCS_ERR_INVALID);
    bad = qos;
    bad.history = 3;
    EXPECT(zcs_ros_subscriber_declare_image(node, "image", &bad, &null_sub), ZCS_ERR_INVALID);
    bad = qos;
    bad.depth = 0;
    EXPECT(zcs_ros_subscriber_declare_tensor(node, "tensor", &bad, &null_sub), ZCS_ERR_INVALID);
    bad.history = ZCS_ROS_HISTORY_KEEP_ALL; /* depth is ignored with keep all */
    CHECK(ip.id == 0 && tp.id == 0 && null_sub.id == 0);

    /* Publishers and subscriptions of both types; topics resolved in the namespace. */
    zcs_ros_subscriber_t is = {0}, ts = {0};
    EXPECT(zcs_ros_publisher_declare_image(node, "image", &bad, &ip), ZCS_OK);
    EXPECT(zcs_ros_publisher_declare_tensor(node, "~/tensor", NULL, &tp), ZCS_OK);
    EXPECT(zcs_ros_subscriber_declare_image(node, "/zcs/image", &bad, &is), ZCS_OK);
    EXPECT(zcs_ros_subscriber_declare_tensor(node, "/zcs/hostile/tensor", NULL, &ts), ZCS_OK);
    EXPECT(zcs_ros_publisher_topic(ip, &str), ZCS_OK);
    CHECK(strcmp(str, "/zcs/image") == 0);
    EXPECT(zcs_ros_publisher_topic(tp, &str), ZCS_OK);
    CHECK(strcmp(str, "/zcs/hostile/tensor") == 0);
    EXPECT(zcs_ros_subscriber_topic(ts, &str), ZCS_OK);
    CHECK(strcmp(str, "/zcs/hostile/tensor") == 0);
    EXPECT(zcs_ros_publisher_topic(ip, NULL), ZCS_ERR_NULL);
    wait_ours(ip);
    wait_ours(tp);

    /* Image fields that do not fit, or are missing. */
    zcs_ros_image_t img = {.stamp_sec = 7, .stamp_nanosec = 8, .frame_id = "cam", .height = 2, .width = 3,
                           .encoding = "rgb8", .is_bigendian = 0, .step = 9};
    EXPECT(zcs_ros_publisher_publish_image_host(ip, NULL, data, 18, &seq), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, NULL, 18, &seq), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 17, &seq), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 19, &seq), ZCS_ERR_INVALID);
    img.frame_id = NULL;
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 18, &seq), ZCS_ERR_NULL);
    img.frame_id = "\xc3\x28";
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 18, &seq), ZCS_ERR_INVALID);
    img.frame_id = "cam";
    img.encoding = NULL;
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 18, &seq), ZCS_ERR_NULL);
    img.encoding = "rgb8";
    img.height = 0x10000;
    img.step = 0x10000; /* step * height is 2^32 bytes: not wrapped to 0 */
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 0, &seq), ZCS_ERR_INVALID);
    img.height = 2;
    img.step = 9;
    CHECK(seq == 0);

    /* A type's publisher refuses the other type. */
    int64_t shape[2] = {2, 3};
    zcs_tensor_t t = {.dtype_code = 1, .dtype_bits = 8, .dtype_lanes = 1, .ndim = 2, .shape = shape};
    EXPECT(zcs_ros_publisher_publish_tensor_host(ip, &t, data, 6, &seq), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_publish_image_host(tp, &img, data, 18, &seq), ZCS_ERR_INVALID);

    /* Tensor descriptions that do not fit. */
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, NULL, data, 6, &seq), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 5, &seq), ZCS_ERR_INVALID); /* 6 bytes needed */
    t.ndim = 65;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.ndim = -1;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.ndim = 2;
    t.dtype_bits = 7;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.dtype_bits = 8;
    t.shape = NULL;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_NULL);
    t.shape = shape;
    int64_t strides[2] = {3, 2}; /* the last element at 1*3 + 2*2 = 7: past 6 bytes */
    t.strides = strides;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.strides = NULL;
    t.byte_offset = 1;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.byte_offset = 0;
    t.device_type = 2; /* kDLCUDA, for host bytes */
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.device_type = 99;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 6, &seq), ZCS_ERR_INVALID);
    t.device_type = 0;
    CHECK(seq == 0);

    /* Loans: refused fields leave the loan with the caller, usable. */
    EXPECT(zcs_ros_publisher_loan(ip, 0, &loan), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_publisher_loan(ip, 18, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_loan(ip, 18, &loan), ZCS_OK);
    uint8_t *host = NULL;
    EXPECT(zcs_loan_host_ptr(loan, &host), ZCS_OK);
    for (int i = 0; i < 18; i++) host[i] = (uint8_t)(100 + i);
    zcs_loan_t kept = loan;
    img.step = 8;
    EXPECT(zcs_ros_publisher_publish_image(ip, &img, &loan, &seq), ZCS_ERR_INVALID);
    img.step = 9;
    EXPECT(zcs_ros_publisher_publish_image(ip, &img, NULL, &seq), ZCS_ERR_NULL);
    EXPECT(zcs_ros_publisher_publish_tensor(ip, &t, &loan, &seq), ZCS_ERR_INVALID); /* wrong type */
    t.shape = shape;
    t.ndim = 2;
    shape[1] = 10; /* 20 bytes, the loan has 18 */
    EXPECT(zcs_ros_publisher_publish_tensor(tp, &t, &loan, &seq), ZCS_ERR_INVALID);
    shape[1] = 3;
    CHECK(loan.id == kept.id && seq == 0);
    EXPECT(zcs_loan_len(loan, &n), ZCS_OK);
    CHECK(n == 18);
    EXPECT(zcs_ros_publisher_publish_image(ip, &img, &loan, &seq), ZCS_OK);
    CHECK(loan.id == 0 && seq == 1);
    EXPECT(zcs_ros_publisher_publish_image(ip, &img, &kept, &seq), ZCS_ERR_STALE); /* published twice */
    EXPECT(zcs_loan_drop(&kept), ZCS_ERR_STALE);

    /* The image arrives, every field and byte as sent. */
    zcs_ros_sample_t sample = {0};
    EXPECT(zcs_ros_subscriber_recv(is, 10000, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_subscriber_recv(is, 10000, &sample), ZCS_OK);
    zcs_ros_image_t got;
    memset(&got, 0, sizeof got);
    EXPECT(zcs_ros_sample_image(sample, &got), ZCS_OK);
    CHECK(got.stamp_sec == 7 && got.stamp_nanosec == 8 && strcmp(got.frame_id, "cam") == 0 && got.height == 2 &&
          got.width == 3 && strcmp(got.encoding, "rgb8") == 0 && got.is_bigendian == 0 && got.step == 9);
    zcs_tensor_t gt;
    EXPECT(zcs_ros_sample_tensor(sample, &gt), ZCS_ERR_INVALID); /* an image is no tensor */
    int64_t aseq = 0, ts_ns = 0;
    uint8_t gid[16] = {0}, zero[16] = {0};
    EXPECT(zcs_ros_sample_attachment(sample, &aseq, &ts_ns, gid), ZCS_OK);
    CHECK(aseq == 1 && ts_ns > 0 && memcmp(gid, zero, 16) != 0);
    EXPECT(zcs_ros_sample_attachment(sample, NULL, NULL, NULL), ZCS_OK);
    const uint8_t *bytes = NULL;
    EXPECT(zcs_ros_sample_host_data(sample, &bytes, &n), ZCS_OK);
    CHECK(n == 18);
    for (size_t i = 0; i < n && bytes; i++) CHECK(bytes[i] == (uint8_t)(100 + i));
    EXPECT(zcs_ros_sample_host_data(sample, NULL, &n), ZCS_ERR_NULL);
    uint8_t small[17], exact[18];
    EXPECT(zcs_ros_sample_copy_to_host(sample, small, sizeof small), ZCS_ERR_INVALID);
    EXPECT(zcs_ros_sample_copy_to_host(sample, exact, sizeof exact), ZCS_OK);
    CHECK(memcmp(exact, bytes, 18) == 0);
    EXPECT(zcs_ros_sample_path(sample, &str), ZCS_OK);
    CHECK(strcmp(str, "plain") != 0);
    /* The data as a sample of our channel, alive after the ROS sample is dropped. */
    zcs_sample_t raw = {0};
    EXPECT(zcs_ros_sample_gpu_sample(sample, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_ros_sample_gpu_sample(sample, &raw), ZCS_OK);
    zcs_ros_sample_t sample2 = sample;
    EXPECT(zcs_ros_sample_drop(&sample), ZCS_OK);
    CHECK(sample.id == 0);
    EXPECT(zcs_ros_sample_drop(&sample2), ZCS_ERR_STALE);
    EXPECT(zcs_ros_sample_image(sample2, &got), ZCS_ERR_STALE);
    EXPECT(zcs_ros_sample_host_data(sample2, &bytes, &n), ZCS_ERR_STALE);
    EXPECT(zcs_ros_sample_gpu_sample(sample2, &raw), ZCS_ERR_STALE);
    EXPECT(zcs_sample_len(raw, &n), ZCS_OK);
    CHECK(n == 18);
    EXPECT(zcs_sample_copy_to_host(raw, exact, sizeof exact), ZCS_OK);
    for (size_t i = 0; i < 18; i++) CHECK(exact[i] == (uint8_t)(100 + i));
    EXPECT(zcs_sample_drop(&raw), ZCS_OK);
    EXPECT(zcs_ros_subscriber_recv(is, 0, &sample), ZCS_ERR_TIMEOUT);
    CHECK(sample.id == 0);

    /* A tensor, from host bytes: its description comes back with explicit strides. */
    shape[0] = 2;
    shape[1] = 3;
    t.dtype_code = 1;
    t.dtype_bits = 16; /* u16 [2, 3]: 12 bytes after 4 of offset */
    t.byte_offset = 4;
    EXPECT(zcs_ros_publisher_publish_tensor_host(tp, &t, data, 16, &seq), ZCS_OK);
    CHECK(seq == 1);
    EXPECT(zcs_ros_subscriber_recv(ts, 10000, &sample), ZCS_OK);
    EXPECT(zcs_ros_sample_image(sample, &got), ZCS_ERR_INVALID); /* a tensor is no image */
    memset(&gt, 0, sizeof gt);
    EXPECT(zcs_ros_sample_tensor(sample, &gt), ZCS_OK);
    CHECK(gt.dtype_code == 1 && gt.dtype_bits == 16 && gt.dtype_lanes == 1 && gt.ndim == 2 && gt.byte_offset == 4 &&
          gt.device_type == 1 && gt.device_id == 0);
    CHECK(gt.shape[0] == 2 && gt.shape[1] == 3 && gt.strides[0] == 3 && gt.strides[1] == 1);
    EXPECT(zcs_ros_sample_data_len(sample, &n), ZCS_OK);
    CHECK(n == 16);
    EXPECT(zcs_ros_sample_drop(&sample), ZCS_OK);

    /* Made-up handles. */
    zcs_ros_publisher_t madeup = {ip.id ^ 0x700000000ull};
    EXPECT(zcs_ros_publisher_publish_image_host(madeup, &img, data, 18, &seq), ZCS_ERR_STALE);
    zcs_ros_node_t madeup_node = {node.id + 1};
    EXPECT(zcs_ros_publisher_declare_image(madeup_node, "/t", NULL, &ip), ZCS_ERR_STALE);

    /* A node dropped: its endpoints live on; nothing new is declared from it. */
    zcs_ros_node_t node2 = node;
    EXPECT(zcs_ros_node_drop(&node), ZCS_OK);
    CHECK(node.id == 0);
    EXPECT(zcs_ros_node_drop(&node2), ZCS_ERR_STALE);
    EXPECT(zcs_ros_node_domain(node2, &domain), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_declare_image(node2, "/t", NULL, &ip), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_publish_image_host(ip, &img, data, 18, &seq), ZCS_OK);
    CHECK(seq == 2);
    EXPECT(zcs_ros_subscriber_recv(is, 10000, &sample), ZCS_OK);
    EXPECT(zcs_ros_sample_attachment(sample, &aseq, NULL, NULL), ZCS_OK);
    CHECK(aseq == 2);

    /* Use after drop. */
    zcs_ros_publisher_t ip2 = ip;
    zcs_ros_subscriber_t is2 = is;
    EXPECT(zcs_ros_publisher_drop(&ip), ZCS_OK);
    EXPECT(zcs_ros_publisher_drop(&ip2), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_publish_image_host(ip2, &img, data, 18, &seq), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_loan(ip2, 18, &loan), ZCS_ERR_STALE);
    EXPECT(zcs_ros_publisher_topic(ip2, &str), ZCS_ERR_STALE);
    EXPECT(zcs_ros_subscriber_drop(&is), ZCS_OK);
    EXPECT(zcs_ros_subscriber_drop(&is2), ZCS_ERR_STALE);
    EXPECT(zcs_ros_subscriber_recv(is2, 0, &sample2), ZCS_ERR_STALE);
    /* A sample outlives its subscription. */
    EXPECT(zcs_ros_sample_image(sample, &got), ZCS_OK);
    CHECK(strcmp(got.frame_id, "cam") == 0);
    EXPECT(zcs_ros_sample_drop(&sample), ZCS_OK);
    EXPECT(zcs_ros_publisher_drop(&tp), ZCS_OK);
    EXPECT(zcs_ros_subscriber_drop(&ts), ZCS_OK);

    /* A closed session. */
    zcs_session_t s2 = s;
    EXPECT(zcs_session_close(&s), ZCS_OK);
    EXPECT(zcs_ros_node_create(s2, "late", NULL, 3, &node), ZCS_ERR_STALE);

    if (failures) {
        fprintf(stderr, "%d ROS calls were not answered as documented\n", failures);
        return 1;
    }
    printf("ros hostile: every call answered as documented\n");
    return 0;
}
