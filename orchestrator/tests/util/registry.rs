//! A real docker-registry on loopback holding the test images (being written).
