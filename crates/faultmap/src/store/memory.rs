//! A buffer as a store: [`MemStore`].

use std::sync::{Arc, RwLock};

use super::{check_range, Store, StoreError};

/// share (keep a clone to look at what was written back).
#[derive(Clone, Debug)]
pub struct MemStore {
    name: String,
    data: Arc<RwLock<Vec<u8>>>,
    len: u64,
}

impl MemStore {
    /// A store over `data`, named `name`.
    pub fn new(name: impl Into<String>, data: impl Into<Arc<[u8]>>) -> Self {
        let data: Arc<[u8]> = data.into();
        Self {
            name: name.into(),
            len: data.len() as u64,
            data: Arc::new(RwLock::new(data.to_vec())),
        }
    }

    /// A copy of the bytes as they are now (with every write-back so far).
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Store for MemStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(&self.name, self.len, offset, buf.len())?;
        // check_range proved offset + len <= data.len(), which is a usize.
        let start = offset as usize;
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        buf.copy_from_slice(&data[start..start + buf.len()]);
        Ok(())
    }

    fn writable(&self) -> bool {
        true
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        check_range(&self.name, self.len, offset, buf.len())?;
        let start = offset as usize;
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        data[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_store_reads_and_refuses_out_of_range() {
        let s = MemStore::new("m", vec![1u8, 2, 3, 4, 5]);
        let mut buf = [0u8; 3];
        s.read_at(2, &mut buf).unwrap();
        assert_eq!(buf, [3, 4, 5]);
        assert!(matches!(
            s.read_at(3, &mut buf),
            Err(StoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            s.read_at(u64::MAX, &mut buf),
            Err(StoreError::OutOfRange { .. })
        ));
    }
}
