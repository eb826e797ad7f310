//! Links the addon the way Node loads it (napi-build sets the platform's
//! linker flags for a library whose N-API symbols come from the host).

fn main() {
    napi_build::setup();
}
